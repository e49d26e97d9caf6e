"""ADBC (Flight SQL) writes against a real `clearice serve`: executeUpdate row counts,
a prepared INSERT with bound parameters, and a refused write. Used by
crates/cli/tests/it/writes.rs.

usage: adbc_writes.py ADDR -> prints JSON
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import pyarrow as pa


def connect(addr, user):
    return flightsql.connect(f"grpc://{addr}", db_kwargs={"username": user, "password": user})


def update(cur, sql):
    stmt = cur.adbc_statement
    stmt.set_sql_query(sql)
    return stmt.execute_update()


def main():
    addr = sys.argv[1]
    out = {}
    with connect(addr, "admin") as conn:
        cur = conn.cursor()
        out["drop"] = update(cur, "DROP SCHEMA IF EXISTS lake.adbc CASCADE")
        out["create_schema"] = update(cur, "CREATE SCHEMA lake.adbc")
        out["create"] = update(cur, "CREATE TABLE lake.adbc.t (id BIGINT, v VARCHAR)")
        out["insert"] = update(cur, "INSERT INTO lake.adbc.t VALUES (1, 'a'), (2, 'b'), (3, 'c')")
        out["ctas"] = update(cur, "CREATE TABLE lake.adbc.c AS SELECT id FROM lake.sales.customers WHERE id < 1000010")
        # a prepared INSERT, parameters bound through DoPut
        stmt = cur.adbc_statement
        stmt.set_sql_query("INSERT INTO lake.adbc.t VALUES ($1, $2)")
        stmt.prepare()
        stmt.bind(pa.record_batch([pa.array([4, 5]), pa.array(["d", "e"])], names=["1", "2"]))
        out["prepared"] = stmt.execute_update()
        out["update"] = update(cur, "UPDATE lake.adbc.t SET v = 'z' WHERE id > 3")
        out["delete"] = update(cur, "DELETE FROM lake.adbc.t WHERE id = 1")
        cur2 = conn.cursor()
        cur2.execute("SELECT id, v FROM lake.adbc.t ORDER BY id")
        out["rows"] = [list(r) for r in cur2.fetchall()]
        # Bulk ingest (CommandStatementIngest): create, then append
        data = pa.table({"k": pa.array([1, 2, 3], pa.int64()), "s": pa.array(["x", "y", None])})
        cur3 = conn.cursor()
        out["ingest_create"] = cur3.adbc_ingest("ingested", data, mode="create",
                                                catalog_name="lake", db_schema_name="adbc")
        out["ingest_append"] = cur3.adbc_ingest("ingested", data, mode="append",
                                                catalog_name="lake", db_schema_name="adbc")
        try:
            cur3.adbc_ingest("ingested", data, mode="create", catalog_name="lake", db_schema_name="adbc")
            out["ingest_again"] = None
        except adbc_driver_manager.Error as e:
            out["ingest_again"] = str(e)
        cur3.execute("SELECT count(*), sum(k) FROM lake.adbc.ingested")
        out["ingested"] = list(cur3.fetchall()[0])
    with connect(addr, "analyst") as conn:
        cur = conn.cursor()
        try:
            update(cur, "INSERT INTO lake.adbc.t VALUES (9, 'x')")
            out["analyst"] = None
        except adbc_driver_manager.Error as e:
            out["analyst"] = str(e)
        try:
            cur.adbc_ingest("ingested", pa.table({"k": pa.array([9], pa.int64()), "s": ["z"]}),
                            mode="append", catalog_name="lake", db_schema_name="adbc")
            out["analyst_ingest"] = None
        except adbc_driver_manager.Error as e:
            out["analyst_ingest"] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
