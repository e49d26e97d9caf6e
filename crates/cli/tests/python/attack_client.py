"""The attack suite, run by crates/cli/tests/it/flight.rs against a real `clearice serve`.

usage: attack_client.py ADDR PATHS_JSON -> prints one JSON object: for each user and each
attack, None (the statement ran) or the error text; plus limits and login measurements.
The Rust test asserts on it and on the filesystem and audit log afterwards.
"""
import json
import sys
import threading
import time

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager


def connect(addr, user, password=None):
    return flightsql.connect(
        f"grpc://{addr}", db_kwargs={"username": user, "password": password or user}
    )


def error_of(fn):
    try:
        fn()
    except adbc_driver_manager.Error as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - any failure is reported to the Rust test
        return f"{type(e).__name__}: {e}"
    return None


def run(conn, sql):
    cur = conn.cursor()
    try:
        cur.execute(sql)
        return cur.fetchall()
    finally:
        cur.close()


def attacks(p):
    """(name, SQL) of every attack; paths come from the test."""
    out, shared, exports = p["outside"], p["shared"], p["exports"]
    return [
        ("read_abs", f"SELECT * FROM '{out}/secret.csv'"),
        ("read_rel_dotdot", "SELECT * FROM '../../outside/secret.csv'"),
        ("read_abs_dotdot", f"SELECT * FROM '{shared}/../../outside/secret.csv'"),
        ("read_symlink", f"SELECT * FROM '{shared}/link.csv'"),
        ("read_file_url", f"SELECT * FROM 'file://{out}/secret.csv'"),
        ("read_s3_url", "SELECT * FROM 's3://bucket/secret.parquet'"),
        ("read_catalog_store", f"SELECT * FROM 'clearice-catalog://local{p['hidden_file']}'"),
        ("read_catalog_s3", "SELECT * FROM 'clearice-s3://lake/wh/sales/customers/data/x.parquet'"),
        ("read_hidden_datafile", f"SELECT * FROM '{p['hidden_file']}'"),
        ("read_json", f"SELECT * FROM '{out}/secret.json'"),
        ("external_outside", f"CREATE EXTERNAL TABLE datafusion.public.t STORED AS CSV LOCATION '{out}/secret.csv'"),
        ("copy_outside_csv", f"COPY (SELECT 'owned' AS x) TO '{out}/owned.csv' STORED AS CSV"),
        ("copy_outside_parquet", f"COPY (SELECT 'owned' AS x) TO '{out}/owned.parquet' STORED AS PARQUET"),
        ("copy_outside_json", f"COPY (SELECT 'owned' AS x) TO '{out}/owned.json' STORED AS JSON"),
        ("copy_outside_dir", f"COPY (SELECT 'owned' AS x) TO '{out}/owned_dir/' STORED AS CSV"),
        ("copy_export_symlink", f"COPY (SELECT 'owned' AS x) TO '{exports}/escape/owned.csv' STORED AS CSV"),
        ("explain_analyze_copy", f"EXPLAIN ANALYZE COPY (SELECT 'owned' AS x) TO '{out}/owned2.csv' STORED AS CSV"),
        ("set_memory", "SET datafusion.runtime.memory_limit = '100G'"),
        ("set_partitions", "SET datafusion.execution.target_partitions = 512"),
        ("set_catalog", "SET datafusion.catalog.default_catalog = 'x'"),
        ("set_crypto", "SET datafusion.execution.parquet.pushdown_filters = false"),
        ("ddl_ctas", "CREATE TABLE lake.sales.stolen AS SELECT 1 AS x"),
        ("ddl_drop", "DROP TABLE lake.sales.customers"),
        ("ddl_schema", "CREATE SCHEMA lake.evil"),
        ("ddl_view", "CREATE VIEW datafusion.public.v AS SELECT 1 AS x"),
        ("ddl_memory_table", "CREATE TABLE datafusion.public.m AS SELECT 1 AS x"),
        ("dml_insert", "INSERT INTO lake.sales.customers (id) VALUES (1)"),
    ]


def granted(p, user):
    """Statements an analyst (granted both areas) may run; a support user may not."""
    shared, exports = p["shared"], p["exports"]
    return [
        ("area_read", f"SELECT * FROM '{shared}/data.csv'"),
        ("area_read_rel", "SELECT * FROM 'data.csv'"),
        ("area_read_dir", f"SELECT * FROM '{shared}/dir/'"),
        ("area_external", f"CREATE EXTERNAL TABLE datafusion.public.t STORED AS CSV LOCATION '{shared}/data.csv'"),
        ("export_csv", f"COPY (SELECT 1 AS x) TO '{exports}/out_{user}.csv' STORED AS CSV"),
        ("export_parquet", f"COPY (SELECT 1 AS x) TO '{exports}/out_{user}.parquet' STORED AS PARQUET"),
        ("export_json", f"COPY (SELECT 1 AS x) TO '{exports}/out_{user}.json' STORED AS JSON"),
        (
            "export_masked",
            f"COPY (SELECT id, ssn FROM lake.sales.customers WHERE id = 1000001) TO '{exports}/ssn_{user}.csv' STORED AS CSV",
        ),
        ("export_denied", f"COPY (SELECT card_number FROM lake.sales.orders) TO '{exports}/cards_{user}.csv' STORED AS CSV"),
        ("set_allowed", "SET datafusion.execution.time_zone = '+01:00'"),
    ]


def limits(addr, out):
    # Statement timeout: a runaway cross join is cancelled by the server.
    conn = connect(addr, "support")
    t = time.time()
    out["timeout_error"] = error_of(
        lambda: run(conn, "SELECT count(*) FROM lake.sales.customers a, lake.sales.customers b WHERE a.id + b.id = -1")
    )
    out["timeout_seconds"] = time.time() - t

    # While support's runaway queries fill its concurrency limit, a third is refused, and
    # another user's point queries still answer quickly.
    runaway = "SELECT count(*) FROM lake.sales.customers a, lake.sales.customers b WHERE a.id + b.id = -2"
    errors = []

    hog_ends = []

    def hog():
        c = connect(addr, "support")
        errors.append(error_of(lambda: run(c, runaway)))
        hog_ends.append(time.time())
        c.close()

    # Another user's connection, logged in and warmed up before the runaway starts (its
    # first call pays the argon2 check and the first table load).
    admin = connect(addr, "admin")
    run(admin, "SELECT id FROM lake.sales.customers WHERE id = 1000001")
    # Three runaway statements of support's, started together: each runs until the
    # statement timeout, so they overlap whatever the machine's load, and with a limit of
    # two concurrent statements one of them is refused.
    threads = [threading.Thread(target=hog) for _ in range(3)]
    for th in threads:
        th.start()
    time.sleep(3)
    out["concurrency_error"] = None
    latencies = []
    first_done = None
    for _ in range(5):
        t = time.time()
        rows = run(admin, "SELECT id FROM lake.sales.customers WHERE id = 1000001")
        latencies.append(time.time() - t)
        first_done = first_done or time.time()
        assert rows == [(1000001,)], rows
    points_done = first_done
    out["point_latencies_during_runaway"] = latencies
    for th in threads:
        th.join()
    out["runaway_errors"] = errors
    # The first point query must have completed while both runaway statements still ran
    # (it was not starved until they ended).
    out["points_before_runaway_ended"] = points_done < max(hog_ends)
    # Memory: one query over its per-query limit fails alone; another user's query runs.
    hungry = "SELECT array_agg(repeat(email, 200)) FROM lake.sales.customers"
    result = {}

    def eat():
        c = connect(addr, "support")
        result["hungry"] = error_of(lambda: run(c, hungry))
        c.close()

    th = threading.Thread(target=eat)
    th.start()
    result["other"] = run(admin, "SELECT count(*) FROM lake.sales.orders")
    th.join()
    out["memory_error"] = result["hungry"]
    out["memory_other_user"] = result["other"]
    admin.close()
    conn.close()


def login(addr, out):
    # 20 wrong passwords in a row, then the right one once the backoff has passed.
    errors = []
    t = time.time()
    for _ in range(20):
        errors.append(error_of(lambda: connect(addr, "analyst", "wrong").close()))
    out["wrong_seconds"] = time.time() - t
    out["wrong_errors"] = errors
    out["right_during_backoff"] = error_of(lambda: connect(addr, "analyst").close())
    time.sleep(2.2)
    out["right_after_backoff"] = error_of(lambda: run(connect(addr, "analyst"), "SELECT 1"))


def main():
    addr = sys.argv[1]
    paths = json.loads(sys.argv[2])
    out = {}
    for user in ["support", "analyst", "admin"]:
        conn = connect(addr, user)
        res = {}
        for name, sql in attacks(paths) + granted(paths, user):
            try:
                res[name] = {"ok": run(conn, sql)}
            except Exception as e:  # noqa: BLE001
                res[name] = {"error": str(e)}
        # An allowed SET lasts for the connection's Flight session, and only for it.
        res["time_zone_after_set"] = run(conn, "SHOW datafusion.execution.time_zone")
        other = connect(addr, user)
        res["time_zone_other_session"] = run(other, "SHOW datafusion.execution.time_zone")
        other.close()
        out[user] = res
        conn.close()
    limits(addr, out)
    login(addr, out)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
