"""What Superset does with a Flight SQL database, through the same SQLAlchemy dialect
(flightsql-dbapi's `datafusion://`): test the connection, list schemas, tables and columns
(SQL Lab's browser), run a query. Run by crates/cli/tests/it/flight.rs.

usage: superset_client.py ADDR -> one JSON object per user.
"""
import json
import sys

from sqlalchemy import create_engine, inspect, text


def main():
    addr = sys.argv[1]
    out = {}
    for user in ["admin", "analyst"]:
        engine = create_engine(f"datafusion://{user}:{user}@{addr}?insecure=true")
        insp = inspect(engine)
        with engine.connect() as conn:
            # Superset's "Test connection" runs SELECT 1
            conn.execute(text("SELECT 1")).fetchall()
            rows = conn.execute(text("SELECT id, ssn FROM lake.sales.customers WHERE id = 1000001")).fetchall()
            # A physical dataset: the dialect drops the catalog, so the server's default
            # catalog (the first configured) completes `sales.customers`.
            two_part = conn.execute(text("SELECT ssn FROM sales.customers WHERE id = 1000001")).fetchall()
        # `?schema=` arrives as a header on every call: one-part names resolve in it.
        with create_engine(f"datafusion://{user}:{user}@{addr}?insecure=true&schema=sales").connect() as conn:
            one_part = conn.execute(text("SELECT ssn FROM customers WHERE id = 1000001")).fetchall()
        out[user] = {
            "schemas": insp.get_schema_names(),
            "tables": insp.get_table_names(schema="sales"),
            "columns": [c["name"] for c in insp.get_columns("customers", schema="sales")],
            "rows": [list(r) for r in rows],
            "two_part": [list(r) for r in two_part],
            "one_part": [list(r) for r in one_part],
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
