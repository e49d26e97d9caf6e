"""PyIceberg as a concurrent writer, for the Rust test `spark::a_query_reads_one_snapshot_while_pyiceberg_appends`.

usage:
  consistency.py create DIR        SqlCatalog in DIR/catalog.db, table db.events (id long),
                                   4 appends of 10,000 rows (4 files)
  consistency.py append DIR N      N more appends of 10,000 rows, each its own commit
Prints {"rows": total rows of the table}.
"""
import json
import os
import sys

import pyarrow as pa


def catalog(d):
    from pyiceberg.catalog.sql import SqlCatalog

    os.makedirs(f"{d}/warehouse", exist_ok=True)
    return SqlCatalog("lake", uri=f"sqlite:///{d}/catalog.db", warehouse=f"file://{d}/warehouse")


def batch(start):
    return pa.table({"id": pa.array(range(start, start + 10_000), pa.int64())})


def main():
    cmd, d, *rest = sys.argv[1:]
    cat = catalog(d)
    if cmd == "create":
        cat.create_namespace("db")
        t = cat.create_table("db.events", schema=batch(0).schema)
        for i in range(4):
            t.append(batch(i * 10_000))
    else:
        t = cat.load_table("db.events")
        n = t.scan().to_arrow().num_rows
        for i in range(int(rest[0])):
            t.append(batch(n + i * 10_000))
    t = cat.load_table("db.events")
    print(json.dumps({"rows": t.scan().to_arrow().num_rows}))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
