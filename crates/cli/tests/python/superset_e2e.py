"""Superset itself against `clearice serve`, as a user sets it up: the repository's dialect and
engine spec (integrations/clearice-sqlalchemy) installed next to Superset, a metadata
database, an admin, then everything through Superset's REST API and its web UI. Run by
crates/cli/tests/it/superset.rs.

usage: superset_e2e.py CLEARICE_ADDR WORKDIR PG_URI -> one JSON object on stdout; WORKDIR
gets the Superset home, its log and the SQL Lab screenshots (sqllab-USER.png). Superset's
metadata goes to a new database on the PostgreSQL server at PG_URI (as in production; its
SQLite migrations leave a unique table name, so two connections cannot both add `orders`),
dropped at the end.

For each principal (admin, analyst) it adds a database connection, tests it, browses
catalogs/schemas/tables, adds physical datasets (lake.sales.orders and customers), reads
their samples, runs SQL Lab queries and time-grain charts (P1M, with a temporal range
filter), and drives SQL Lab in headless Chromium. The chart answers are compared with the
same aggregation computed here from the raw rows."""

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from datetime import date, datetime, timezone
from decimal import Decimal
from pathlib import Path

import requests

USERS = ["admin", "analyst"]
SUPERSET_PASSWORD = secrets.token_urlsafe(16)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def superset_cli(env, *args, timeout=600):
    bin_dir = Path(sys.executable).parent
    out = subprocess.run(
        [str(bin_dir / "superset"), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if out.returncode != 0:
        raise SystemExit(f"superset {' '.join(args[:2])} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")


def start_superset(work: Path, metadata_uri: str):
    """Metadata DB, admin, roles; then gunicorn on a free port (read from its log)."""
    home = work / "superset-home"
    home.mkdir()
    config = work / "superset_config.py"
    config.write_text(
        f"SECRET_KEY = {secrets.token_urlsafe(42)!r}\n"
        f"SQLALCHEMY_DATABASE_URI = {metadata_uri!r}\n"
        "TALISMAN_ENABLED = False\n"
        "RATELIMIT_ENABLED = False\n"
        "CACHE_CONFIG = {'CACHE_TYPE': 'NullCache'}\n"
        "DATA_CACHE_CONFIG = {'CACHE_TYPE': 'NullCache'}\n"
        "SUPERSET_WEBSERVER_TIMEOUT = 120\n"
    )
    env = {
        **os.environ,
        "SUPERSET_CONFIG_PATH": str(config),
        "SUPERSET_HOME": str(home),
        "FLASK_APP": "superset.app:create_app()",
        "PYTHONWARNINGS": "ignore",
    }
    t = time.time()
    superset_cli(env, "db", "upgrade")
    superset_cli(
        env, "fab", "create-admin", "--username", "admin", "--firstname", "Ada", "--lastname", "Admin",
        "--email", "admin@example.com", "--password", SUPERSET_PASSWORD,
    )
    superset_cli(env, "init")
    log(f"superset metadata ready in {time.time() - t:.0f}s")
    server_log = open(work / "superset.log", "w")
    bin_dir = Path(sys.executable).parent
    proc = subprocess.Popen(
        [str(bin_dir / "gunicorn"), "-w", "1", "--threads", "8", "--timeout", "300",
         "-b", "127.0.0.1:0", "superset.app:create_app()"],
        env=env, stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    deadline = time.time() + 180
    base = None
    while time.time() < deadline:
        text = (work / "superset.log").read_text(errors="replace")
        if m := re.search(r"Listening at: (http://127\.0\.0\.1:\d+)", text):
            base = m.group(1)
            try:
                if requests.get(base + "/health", timeout=5).text == "OK":
                    return proc, base
            except requests.RequestException:
                pass
        if proc.poll() is not None:
            break
        time.sleep(1)
    stop(proc)
    raise SystemExit(f"Superset did not start ({base}):\n{(work / 'superset.log').read_text()[-4000:]}")


def stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class Api:
    """Superset's REST API as a logged-in admin: JWT bearer plus the CSRF token."""

    def __init__(self, base):
        self.base = base
        self.s = requests.Session()
        r = self.s.post(
            base + "/api/v1/security/login",
            json={"username": "admin", "password": SUPERSET_PASSWORD, "provider": "db", "refresh": True},
            timeout=120,
        )
        r.raise_for_status()
        self.s.headers["Authorization"] = "Bearer " + r.json()["access_token"]
        csrf = self.s.get(base + "/api/v1/security/csrf_token/", timeout=120)
        csrf.raise_for_status()
        self.s.headers["X-CSRFToken"] = csrf.json()["result"]
        self.s.headers["Referer"] = base
        # views outside /api/v1 (dataset samples) take the browser's session cookie
        form = self.s.get(base + "/login/", timeout=120).text
        token = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', form) or re.search(
            r'value="([^"]+)"[^>]*name="csrf_token"', form
        )
        if token is None:
            raise SystemExit("Superset's login form has no csrf_token")
        r = self.s.post(base + "/login/", data={"username": "admin", "password": SUPERSET_PASSWORD,
                                                "csrf_token": token.group(1)}, timeout=120)
        r.raise_for_status()

    def call(self, method, path, expect=(200, 201), **kw):
        r = self.s.request(method, self.base + path, timeout=300, **kw)
        if r.status_code not in expect:
            raise SystemExit(f"{method} {path}: HTTP {r.status_code}: {r.text[:2000]}")
        return r.json()


def months(rows):
    """SUM(amount) and COUNT(*) of (order_date, amount) rows by month: the oracle."""
    total, count = defaultdict(Decimal), defaultdict(int)
    for d, amount in rows:
        key = date.fromisoformat(str(d)[:10]).replace(day=1).isoformat()
        count[key] += 1
        if amount is not None:
            total[key] += Decimal(str(amount))
    return {k: [str(total[k]) if k in total else None, count[k]] for k in sorted(count)}


def epoch_ms_to_day(v):
    return datetime.fromtimestamp(v / 1000, tz=timezone.utc).date().isoformat()


def sqllab(api, db, sql):
    r = api.call(
        "POST", "/api/v1/sqllab/execute/",
        json={"database_id": db, "sql": sql, "catalog": "lake", "schema": "sales", "runAsync": False,
              "client_id": secrets.token_hex(5), "tab": "e2e", "queryLimit": 100000},
    )
    if r.get("status") != "success":
        raise SystemExit(f"SQL Lab query failed: {json.dumps(r)[:2000]}")
    return r


def chart(api, dataset, column, grain, metrics, time_range=None):
    q = {
        "columns": [{"timeGrain": grain, "columnType": "BASE_AXIS", "sqlExpression": column,
                     "label": column, "expressionType": "SQL"}],
        "metrics": metrics,
        "orderby": [[metrics[0], False]],
        "row_limit": 10000,
        "filters": [],
    }
    if time_range:
        q["filters"].append({"col": column, "op": "TEMPORAL_RANGE", "val": time_range})
    r = api.call(
        "POST", "/api/v1/chart/data",
        json={"datasource": {"id": dataset, "type": "table"}, "force": True, "queries": [q],
              "result_format": "json", "result_type": "full"},
    )
    res = r["result"][0]
    return res


def per_user(api, addr, user, work):
    out = {}
    # admin names the catalog and schema in the URL; analyst leaves them to the server
    uri = f"clearice://{user}:{user}@{addr}/lake/sales" if user == "admin" else f"clearice://{user}:{user}@{addr}"
    api.call("POST", "/api/v1/database/test_connection/",
             json={"sqlalchemy_uri": uri, "database_name": f"ClearIce ({user})"})
    db = api.call("POST", "/api/v1/database/",
                  json={"database_name": f"ClearIce ({user})", "sqlalchemy_uri": uri, "expose_in_sqllab": True})["id"]
    info = api.call("GET", f"/api/v1/database/{db}")["result"]
    out["backend"] = info["backend"]
    out["catalogs"] = api.call("GET", f"/api/v1/database/{db}/catalogs/")["result"]
    out["schemas"] = api.call("GET", f"/api/v1/database/{db}/schemas/?q=(catalog:lake)")["result"]
    tables = api.call("GET", f"/api/v1/database/{db}/tables/?q=(catalog_name:lake,schema_name:sales,force:!t)")
    out["tables"] = sorted(t["value"] for t in tables["result"])

    datasets = {}
    for table in ["orders", "customers"]:
        ds = api.call("POST", "/api/v1/dataset/",
                      json={"database": db, "catalog": "lake", "schema": "sales", "table_name": table})["id"]
        datasets[table] = ds
        cols = api.call("GET", f"/api/v1/dataset/{ds}")["result"]["columns"]
        out[f"{table}_columns"] = {c["column_name"]: {"type": c["type"], "is_dttm": c["is_dttm"]} for c in cols}
        samples = api.call("POST", f"/datasource/samples?datasource_type=table&datasource_id={ds}", json={})
        out[f"{table}_samples"] = {"rows": len(samples["result"]["data"]),
                                   "columns": sorted(samples["result"]["colnames"])}

    r = sqllab(api, db, "SELECT id, ssn, email, balance FROM customers WHERE id = 1000001")
    out["sqllab"] = r["data"]
    out["sqllab_types"] = {c["column_name"]: c["type"] for c in r["columns"]}
    # three-part names work whatever the connection's catalog
    out["sqllab_three_part"] = sqllab(api, db, "SELECT count(*) AS n FROM lake.sales.orders")["data"]
    # a column hidden from the principal is not there: ClearIce's own error, through Superset
    r = api.s.post(
        api.base + "/api/v1/sqllab/execute/",
        json={"database_id": db, "sql": "SELECT card_number FROM orders LIMIT 1", "catalog": "lake",
              "schema": "sales", "runAsync": False, "client_id": secrets.token_hex(5), "tab": "e2e"},
        timeout=300,
    )
    if r.status_code == 200 and r.json().get("status") == "success":
        out["card_number"] = "read"
    else:
        out["card_number"] = [e.get("message", "") for e in r.json().get("errors", [])]

    # the oracle: the raw rows as this principal reads them (through the dialect, not
    # Superset), aggregated here
    from sqlalchemy import create_engine, text

    with create_engine(uri).connect() as conn:
        raw = conn.execute(text("SELECT order_date, amount FROM lake.sales.orders")).fetchall()
    out["oracle"] = months(raw)
    total = {"expressionType": "SIMPLE", "column": {"column_name": "amount"}, "aggregate": "SUM", "label": "total"}
    count = {"expressionType": "SQL", "sqlExpression": "COUNT(*)", "label": "orders"}
    res = chart(api, datasets["orders"], "order_date", "P1M", [total, count])
    out["chart_query"] = res["query"]
    out["chart"] = {epoch_ms_to_day(r["order_date"]): [r["total"], r["orders"]] for r in res["data"]}
    res = chart(api, datasets["orders"], "order_date", "P1M", [total, count], "2025-01-01 : 2025-03-01")
    out["chart_range_query"] = res["query"]
    out["chart_range"] = {epoch_ms_to_day(r["order_date"]): [r["total"], r["orders"]] for r in res["data"]}
    # a mask in a chart: the analyst's birth_date is truncated to the year
    res = chart(api, datasets["customers"], "birth_date", "P1M", [count])
    out["birth_months"] = sorted({epoch_ms_to_day(r["birth_date"])[5:7] for r in res["data"] if r["birth_date"]})
    out["database_id"] = db
    return out


def screenshot(base, db, user, sql, expect, work):
    """SQL Lab in headless Chromium: log in, open a tab with SQL on this database, run it,
    wait for the expected value in the result grid, save a screenshot."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CLEARICE_CHROMIUM", "/usr/bin/chromium")
    profile = work / f"chromium-{user}"
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,900", f"--user-data-dir={profile}"]:
        opts.add_argument(flag)
    driver = webdriver.Chrome(
        service=Service(os.environ.get("CLEARICE_CHROMEDRIVER", "/usr/bin/chromedriver")), options=opts
    )
    try:
        wait = WebDriverWait(driver, 120)
        driver.get(base + "/login/")
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "input[name='username'], #username")))
        driver.find_element(By.CSS_SELECTOR, "input[name='username'], #username").send_keys("admin")
        password = driver.find_element(By.CSS_SELECTOR, "input[name='password'], #password")
        password.send_keys(SUPERSET_PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "button[type='submit'], input[type='submit']").click()
        wait.until(lambda d: "/login" not in d.current_url)
        q = requests.models.PreparedRequest()
        q.prepare_url(base + "/sqllab/", {"dbid": db, "catalog": "lake", "schema": "sales", "sql": sql,
                                           "autorun": "true", "new": "true"})
        driver.get(q.url)
        wait.until(lambda d: expect in d.find_element(By.TAG_NAME, "body").text)
        shot = work / f"sqllab-{user}.png"
        driver.save_screenshot(str(shot))
        return {"screenshot": str(shot), "page": driver.find_element(By.TAG_NAME, "body").text}
    except Exception as e:  # noqa: BLE001  the page's text helps more than the trace
        driver.save_screenshot(str(work / f"sqllab-{user}-failed.png"))
        body = driver.find_element(By.TAG_NAME, "body").text[-2000:]
        raise SystemExit(f"SQL Lab in Chromium as {user}: {type(e).__name__} {e}\npage: {body}") from None
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def metadata_database(pg_uri: str):
    """A new PostgreSQL database for Superset's metadata: (its URI, a function dropping it)."""
    import psycopg2

    name = "superset_" + secrets.token_hex(4)
    admin = psycopg2.connect(pg_uri)
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {name}")

    def drop():
        admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.close()

    base = pg_uri.rsplit("/", 1)[0].replace("postgres://", "postgresql://", 1)
    return f"{base}/{name}", drop


def main():
    addr, work, pg_uri = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    metadata_uri, drop = metadata_database(pg_uri)
    try:
        run(addr, work, metadata_uri)
    finally:
        drop()


def run(addr, work, metadata_uri):
    proc, base = start_superset(work, metadata_uri)
    try:
        api = Api(base)
        out = {u: per_user(api, addr, u, work) for u in USERS}
        # the analyst's email is sha256 of the admin's plaintext: computed here
        admin_email = out["admin"]["sqllab"][0]["email"]
        out["email_sha256"] = hashlib.sha256(admin_email.encode()).hexdigest()
        sql = "SELECT id, ssn, email FROM customers WHERE id = 1000001"
        for u in USERS:
            expect = out[u]["sqllab"][0]["ssn"]
            out[u]["ui"] = screenshot(base, out[u]["database_id"], u, sql, expect, work)
    finally:
        stop(proc)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
