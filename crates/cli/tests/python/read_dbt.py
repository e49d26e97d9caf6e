"""Reads what the dbt project (integrations/dbt-clearice/tests/project) built through
`clearice serve`, with PyIceberg (catalog, manifests) and PyArrow's own PME (CryptoFactory,
the keyring KMS): the gold table's rows, whether its files can be read without keys, and
the table list of the dbt schemas. Used by crates/cli/tests/it/dbt.rs.

usage: read_dbt.py CATALOG_DB WAREHOUSE KEYRING.json REGIONS.csv MAX_ID -> prints JSON
"""
import base64
import json
import sys

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
from pyiceberg.catalog.sql import SqlCatalog

from read_written import KeyringKmsClient, local


def read(cat, name, props):
    tbl = cat.load_table(name)
    files = [local(f["file_path"]) for f in tbl.inspect.files().to_pylist()]
    plain_read = []
    for f in files:
        try:
            pq.read_table(f)
            plain_read.append("read")
        except OSError as e:  # PME without keys: ArrowException / OSError
            plain_read.append(type(e).__name__)
    tables = [pq.read_table(f, decryption_properties=props) for f in files]
    rows = pa.concat_tables(tables).to_pylist() if tables else []
    return {"rows": rows, "files": len(files), "without_keys": plain_read,
            "snapshots": [s.summary.operation.value for s in tbl.metadata.snapshots]}


def main():
    db, warehouse, keyring_path = sys.argv[1:4]
    cat = SqlCatalog("lake", uri=f"sqlite:///{db}", warehouse=warehouse)
    keyring = {k: base64.b64decode(v) for k, v in json.load(open(keyring_path)).items()}
    factory = pe.CryptoFactory(lambda cfg: KeyringKmsClient(keyring))
    props = factory.file_decryption_properties(pe.KmsConnectionConfig(), pe.DecryptionConfiguration())
    out = {"tables": {}}
    for ns in ["dbt_ref", "dbt_silver", "dbt_gold", "dbt_snap"]:
        out["tables"][ns] = sorted(t[1] for t in cat.list_tables(ns))
    # the snapshot (no protected columns) through PyIceberg's scan, which applies the
    # merges' deletes
    history = cat.load_table("dbt_snap.customer_tiers").scan().to_arrow()
    out["dbt_snap.customer_tiers"] = sorted(history.to_pylist(), key=lambda r: (r["id"], r["tier"]))
    for name in ["dbt_gold.customer_orders", "dbt_gold.order_log", "dbt_gold.order_total",
                 "dbt_ref.regions", "dbt_silver.stg_customers"]:
        out[name] = read(cat, name, props)
    # The same gold table computed independently: DuckDB over the demo tables' plaintext
    # (decrypted by PyArrow) and the seed's CSV.
    import duckdb

    customers = pa.concat_tables(
        [pq.read_table(local(f["file_path"]), decryption_properties=props)
         for f in cat.load_table("sales.customers").inspect.files().to_pylist()])
    orders = pa.concat_tables(
        [pq.read_table(local(f["file_path"]), decryption_properties=props)
         for f in cat.load_table("sales.orders").inspect.files().to_pylist()])
    regions = pa.csv.read_csv(sys.argv[4]) if len(sys.argv) > 4 else None
    con = duckdb.connect()
    con.register("customers", customers)
    con.register("orders", orders)
    con.register("regions", regions)
    max_id = int(sys.argv[5]) if len(sys.argv) > 5 else 1000400
    expected = con.execute(f"""
        SELECT c.id, r.region, count(o.order_id) AS orders, sum(o.amount) AS total
        FROM customers c JOIN orders o ON o.customer_id = c.id
        LEFT JOIN regions r ON r.country = c.country
        WHERE c.id < {max_id} GROUP BY c.id, r.region ORDER BY c.id""").fetchall()
    out["expected"] = [[i, region, n, str(total)] for i, region, n, total in expected]
    gold = sorted(out["dbt_gold.customer_orders"]["rows"], key=lambda r: r["id"])
    out["gold"] = [[r["id"], r["region"], r["orders"], str(r["total"])] for r in gold]
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
