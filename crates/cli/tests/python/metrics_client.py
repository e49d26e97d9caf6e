"""ADBC Flight SQL client run by crates/cli/tests/it/metrics.rs against `clearice serve`:
statements that end ok, denied and failed, and a refused login, for the metrics to count.

usage: metrics_client.py ADDR -> prints one JSON object with what happened.
"""
import json
import sys

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager


def connect(addr, user, password):
    return flightsql.connect(f"grpc://{addr}", db_kwargs={"username": user, "password": password})


def main():
    addr = sys.argv[1]
    out = {}
    with connect(addr, "admin", "admin") as conn, conn.cursor() as cur:
        cur.execute("SELECT id, ssn, email FROM lake.sales.customers WHERE id = 1000001")
        out["admin_rows"] = len(cur.fetchall())
        cur.execute("SELECT count(*) FROM lake.sales.orders")
        out["admin_orders"] = cur.fetchall()[0][0]
    with connect(addr, "analyst", "analyst") as conn, conn.cursor() as cur:
        try:
            cur.execute("SELECT card_number FROM lake.sales.orders")
            cur.fetchall()
            out["analyst_denied"] = None
        except adbc_driver_manager.Error as e:
            out["analyst_denied"] = str(e)
        try:
            cur.execute("SELECT no_such_column FROM lake.sales.customers")
            cur.fetchall()
            out["analyst_error"] = None
        except adbc_driver_manager.Error as e:
            out["analyst_error"] = str(e)
    for user in ["admin", "intruder-7f3a9c"]:
        try:
            with connect(addr, user, "not-the-password") as conn, conn.cursor() as cur:
                cur.execute("SELECT 1")
            out[f"bad_login_{user}"] = None
        except adbc_driver_manager.Error as e:
            out[f"bad_login_{user}"] = str(e)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
