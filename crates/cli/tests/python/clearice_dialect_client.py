"""The clearice:// SQLAlchemy dialect (integrations/clearice-sqlalchemy) on its own, as
Superset and pandas use it, against `clearice serve`: every time grain of the Superset engine
spec run by ClearIce on a TIMESTAMP and a DATE (expected values computed here), writes through
the cursor (DDL, INSERT with its row count, executemany with bound parameters), reflection
with SQLAlchemy Core, and the URL's refusals. Run by crates/cli/tests/it/superset.rs.

usage: clearice_dialect_client.py ADDR -> one JSON object.
"""
import json
import sys
from datetime import date, datetime, timedelta

from sqlalchemy import MetaData, Table, create_engine, exc, inspect, select, text

from clearice_sqlalchemy.superset import ClearIceEngineSpec

POINT = datetime(2024, 5, 16, 13, 47, 31, 250000)  # a Thursday

SECONDS = {"PT1S": 1, "PT5S": 5, "PT30S": 30, "PT1M": 60, "PT5M": 300, "PT10M": 600, "PT15M": 900,
           "PT30M": 1800, "PT1H": 3600, "PT6H": 6 * 3600, "P1D": 86400}


def expected(grain: str, t: datetime) -> datetime:
    """The start of the grain's bucket holding t (epoch-aligned fixed intervals; weeks from
    Monday; calendar months, quarters, years)."""
    if grain in SECONDS:
        epoch = datetime(1970, 1, 1)
        n = int((t - epoch).total_seconds()) // SECONDS[grain] * SECONDS[grain]
        return epoch + timedelta(seconds=n)
    day = datetime(t.year, t.month, t.day)
    if grain in ("P1W", "1969-12-29T00:00:00Z/P1W"):
        return day - timedelta(days=day.weekday())
    if grain == "P1M":
        return day.replace(day=1)
    if grain == "P3M":
        return day.replace(month=(t.month - 1) // 3 * 3 + 1, day=1)
    if grain == "P1Y":
        return day.replace(month=1, day=1)
    raise ValueError(grain)


def grains(conn):
    out = {}
    for grain, expr in ClearIceEngineSpec._time_grain_expressions.items():
        if grain is None:
            continue
        got = conn.execute(text(
            f"SELECT {expr.format(col='t')} AS g FROM (SELECT TIMESTAMP '{POINT.isoformat(sep=' ')}' AS t) s"
        )).scalar()
        want = expected(str(grain), POINT)
        out[str(grain)] = {"got": str(got).replace("T", " "), "expected": str(want)}
        if str(grain) in ("P1D", "P1W", "P1M", "P3M", "P1Y"):
            d = conn.execute(text(
                f"SELECT {expr.format(col='d')} AS g FROM (SELECT DATE '{POINT.date().isoformat()}' AS d) s"
            )).scalar()
            out[str(grain) + " date"] = {"got": str(d).replace("T", " "), "expected": str(want)}
    return out


def refused(url, **kw):
    try:
        create_engine(url, **kw).connect().close()
        return "connected"
    except (exc.ArgumentError, exc.DBAPIError, exc.InterfaceError) as e:
        return str(e)


class FakeDatabase:
    """What the engine spec reads of Superset's Database model."""

    def __init__(self, encrypted_extra):
        self.encrypted_extra = encrypted_extra


def superset_connect_args():
    """Secure Extra's token is added to the Root certificate, and file or no-verify options
    are refused there."""
    out = {}
    params = {"connect_args": {"tls_root_certs_pem": "PEM"}}
    ClearIceEngineSpec.update_params_from_encrypted_extra(
        FakeDatabase(json.dumps({"connect_args": {"token": "tok"}})), params)
    out["merged"] = params
    for key in ["tls_root_certs", "tls_skip_verify"]:
        try:
            ClearIceEngineSpec.update_params_from_encrypted_extra(
                FakeDatabase(json.dumps({"connect_args": {key: "x"}})), {})
            out[key] = "accepted"
        except ValueError as e:
            out[key] = str(e)
    return out


def main():
    addr = sys.argv[1]
    out = {}
    admin = create_engine(f"clearice://admin:admin@{addr}/lake/sales")
    with admin.connect() as conn:
        out["grains"] = grains(conn)
        conn.execute(text("CREATE SCHEMA IF NOT EXISTS lake.dialect"))
        conn.execute(text("CREATE TABLE lake.dialect.t (id BIGINT, name VARCHAR, at TIMESTAMP)"))
        many = conn.execute(
            text("INSERT INTO lake.dialect.t (id, name, at) VALUES (:id, :name, :at)"),
            [{"id": 1, "name": "a", "at": datetime(2024, 1, 2, 3, 4, 5)},
             {"id": 2, "name": "b", "at": None}],
        )
        out["executemany_rowcount"] = many.rowcount
        one = conn.execute(text("INSERT INTO lake.dialect.t SELECT id + 10, name, at FROM lake.dialect.t"))
        out["insert_rowcount"] = one.rowcount
        # a query whose one column is called count is a query: its rows are returned
        out["count_query"] = [list(r) for r in conn.execute(
            text("SELECT count(*) AS count FROM lake.dialect.t")).fetchall()]
        t = Table("t", MetaData(), schema="dialect", autoload_with=conn)
        out["reflected"] = {c.name: str(c.type) for c in t.columns}
        rows = conn.execute(select(t.c.id, t.c.name).order_by(t.c.id).limit(2).offset(1)).fetchall()
        out["core_rows"] = [list(r) for r in rows]
        out["tables"] = inspect(conn).get_table_names(schema="dialect")
        conn.execute(text("DROP TABLE lake.dialect.t"))
        out["tables_after_drop"] = inspect(conn).get_table_names(schema="dialect")
    analyst = create_engine(f"clearice://analyst:analyst@{addr}")
    with analyst.connect() as conn:
        out["analyst_ssn"] = conn.execute(text("SELECT ssn FROM sales.customers WHERE id = 1000001")).scalar()
        out["analyst_default_catalog"] = analyst.dialect.default_catalog(conn)
    # the pools close their connections through the dialect (cursors first, as ADBC wants)
    admin.dispose()
    analyst.dispose()
    out["refusals"] = {
        "token": refused(f"clearice://{addr}/lake?token=secret"),
        "unknown": refused(f"clearice://admin:admin@{addr}/lake?tsl=true"),
        "skip_verify_without_tls": refused(f"clearice://admin:admin@{addr}/lake?tls_skip_verify=true"),
        "no_user": refused(f"clearice://{addr}/lake"),
        "ca_not_a_file": refused(f"clearice://admin:admin@{addr}/lake?tls=true&tls_root_certs=/dev/zero"),
        "bad_password": refused(f"clearice://admin:wrong@{addr}/lake"),
    }
    out["superset"] = superset_connect_args()
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
