"""ADBC Flight SQL client run by crates/cli/tests/it/flight.rs against a real `clearice serve`.

usage: adbc_client.py ADDR -> prints one JSON object with what each user saw.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager


def connect(addr, user, password):
    return flightsql.connect(f"grpc://{addr}", db_kwargs={"username": user, "password": password})


def error_of(fn):
    try:
        fn()
    except adbc_driver_manager.Error as e:  # DatabaseError, ProgrammingError, ...
        return str(e)
    except Exception as e:  # noqa: BLE001 - any failure is reported to the Rust test
        return f"{type(e).__name__}: {e}"
    return None


def run(cur, sql):
    cur.execute(sql)
    return cur.fetchall()


def main():
    addr = sys.argv[1]
    out = {}
    for user in ["admin", "analyst", "support"]:
        conn = connect(addr, user, user)
        cur = conn.cursor()
        cur.execute("SELECT id, ssn, email FROM lake.sales.customers WHERE id = 1000001")
        rows = cur.fetchall()
        # prepared statement with a parameter (bound through DoPut)
        cur.execute("SELECT id, ssn FROM lake.sales.customers WHERE id = $1", parameters=(1000002,))
        prepared = cur.fetchall()
        cur.execute("SELECT count(*) FROM lake.sales.orders")
        count = cur.fetchall()
        objs = conn.adbc_get_objects(depth="columns", catalog_filter="lake").read_all().to_pylist()
        tables = {}
        for cat in objs:
            for sch in cat["catalog_db_schemas"] or []:
                for t in sch["db_schema_tables"] or []:
                    tables[f'{cat["catalog_name"]}.{sch["db_schema_name"]}.{t["table_name"]}'] = [
                        c["column_name"] for c in (t["table_columns"] or [])
                    ]
        schema = conn.adbc_get_table_schema("customers", catalog_filter="lake", db_schema_filter="sales")
        # Flight SQL column metadata of a result (table, type, precision, scale)
        cur.execute("SELECT id, id + 1 AS next FROM lake.sales.customers LIMIT 1")
        result = cur.fetch_arrow_table().schema
        column_meta = {
            f.name: {k.decode(): v.decode() for k, v in (f.metadata or {}).items() if k.startswith(b"ARROW:FLIGHT:SQL:")}
            for f in result
        }
        denied = error_of(lambda: run(cur, "SELECT card_number FROM lake.sales.orders LIMIT 1"))
        bad_sql = error_of(lambda: run(cur, "SELEC nonsense"))
        # session options (SetSessionOptions/GetSessionOptions), as DBeaver's `catalog=` does
        default_catalog = conn.adbc_current_catalog
        conn.adbc_current_catalog = "lake"
        conn.adbc_current_db_schema = "sales"
        unqualified = run(cur, "SELECT ssn FROM customers WHERE id = 1000001")
        bad_catalog = error_of(lambda: setattr(conn, "adbc_current_catalog", "nope"))
        out[user] = {
            "rows": [list(r) for r in rows],
            "prepared": [list(r) for r in prepared],
            "count": count[0][0],
            "tables": tables,
            "schema": schema.names,
            "schema_types": [str(t) for t in schema.types],
            "denied": denied,
            "bad_sql": bad_sql,
            "session": [default_catalog, conn.adbc_current_catalog, conn.adbc_current_db_schema],
            "unqualified": [list(r) for r in unqualified],
            "column_meta": column_meta,
            "bad_catalog": bad_catalog,
        }
        cur.close()
        conn.close()
    # `catalog`/`schema` headers on every call (ADBC's call_header options; JDBC and
    # SQLAlchemy URLs send their unknown parameters the same way)
    def with_headers(**headers):
        kwargs = {"username": "analyst", "password": "analyst"}
        kwargs.update({f"adbc.flight.sql.rpc.call_header.{k}": v for k, v in headers.items()})
        conn = flightsql.connect(f"grpc://{addr}", db_kwargs=kwargs)
        try:
            with conn.cursor() as cur:
                return run(cur, "SELECT ssn FROM customers WHERE id = 1000001")
        finally:
            conn.close()

    out["header_schema"] = [list(r) for r in with_headers(schema="sales")]
    out["header_bad_catalog"] = error_of(lambda: with_headers(catalog="nope", schema="sales"))
    out["no_header"] = error_of(lambda: with_headers())
    out["wrong_password"] = error_of(lambda: connect(addr, "admin", "nope"))
    out["unknown_user"] = error_of(lambda: connect(addr, "mallory", "mallory"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
