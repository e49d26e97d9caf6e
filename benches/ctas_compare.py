"""CREATE TABLE AS of N rows (default 5M) into an Iceberg table: ClearIce encrypting three
columns by policy, ClearIce writing the same plaintext, and PyArrow + PyIceberg writing
the same data with the same encryption (CryptoFactory, double wrapping, the same keyring
KMS) and committing it. One run, alternating order, median of --runs; prints a Markdown
table and the ratios.

usage: python benches/ctas_compare.py --clearice target/release/clearice [--rows 5000000] [--runs 3]
needs: pyarrow, pyiceberg[sql-sqlite], cryptography (scripts/requirements-test.txt) and
       CLEARICE_SHARED (the shared interop dir with make_fixtures.py).
"""
import argparse
import base64
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute
import pyarrow.parquet as pq
import pyarrow.parquet.encryption as pe
from pyiceberg.catalog.sql import SqlCatalog


def load_make_fixtures():
    shared = Path(os.environ.get("CLEARICE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    spec = importlib.util.spec_from_file_location("make_fixtures", shared / "interop" / "make_fixtures.py")
    mf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mf)
    return mf


def source_table(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    ids = np.arange(n, dtype=np.int64)
    countries = np.array(["DE", "FR", "US", "GB", "JP", "BR", "ES", "IT"])
    ssn = pa.array([f"{a:03d}-{b:02d}-{c:04d}" for a, b, c in zip(
        rng.integers(100, 999, n), rng.integers(10, 99, n), rng.integers(1000, 9999, n))])
    email = pa.compute.binary_join_element_wise(
        pa.array(np.char.add("user", ids.astype(str))), pa.scalar("example.com"), "@")
    return pa.table({
        "id": ids,
        "name": pa.array(np.char.add("name", (ids % 100000).astype(str))),
        "ssn": ssn,
        "email": email,
        "balance": rng.normal(5000, 2000, n).round(2),
        "country": pa.array(countries[rng.integers(0, len(countries), n)]),
        "ts": pa.array((ids * 1_000_000 + 1_700_000_000_000_000).astype("datetime64[us]")),
    })


POLICY = """
[users]
bench = { roles = ["writer"] }

[roles]
writer = {}

[writes]
create = ["writer"]

[tables."lake.b.enc"]
footer_key = "footer_key"
write = ["writer"]

[tables."lake.b.enc".columns.ssn]
master_key = "pii_key"
write = ["writer"]
access = { writer = "plaintext" }

[tables."lake.b.enc".columns.email]
master_key = "pii_key"
write = ["writer"]
access = { writer = "plaintext" }

[tables."lake.b.enc".columns.balance]
master_key = "finance_key"
write = ["writer"]
access = { writer = "plaintext" }
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clearice", required=True)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    mf = load_make_fixtures()
    tmp = Path(tempfile.mkdtemp(prefix="ctas-bench-"))
    keyring = {k: base64.b64encode(os.urandom(16)).decode() for k in ["footer_key", "pii_key", "finance_key"]}
    (tmp / "keyring.json").write_text(json.dumps(keyring))
    (tmp / "policy.toml").write_text(POLICY)
    warehouse = f"file://{tmp / 'warehouse'}"
    (tmp / "clearice.toml").write_text(
        f'[catalogs.lake]\ntype = "sql"\nuri = "sqlite://{tmp}/catalog.db?mode=rwc"\nwarehouse = "{warehouse}"\n'
        f'[kms]\ntype = "keyring"\npath = "keyring.json"\n[policy]\npath = "policy.toml"\n')
    src = tmp / "source.parquet"
    t0 = time.perf_counter()
    table = source_table(args.rows)
    pq.write_table(table, src, row_group_size=1 << 20)
    print(f"source: {args.rows} rows, {src.stat().st_size / 1e6:.0f} MB ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)

    def clearice(sql):
        subprocess.run([args.clearice, "--config", str(tmp / "clearice.toml"), "--user", "bench", "-q", "-c", sql],
                       check=True, stdout=subprocess.DEVNULL)

    clearice("CREATE SCHEMA lake.b")
    cat = SqlCatalog("lake", uri=f"sqlite:///{tmp}/catalog.db", warehouse=warehouse)
    keys = {k: base64.b64decode(v) for k, v in keyring.items()}
    cf = mf.crypto_factory(keys)
    config = pe.EncryptionConfiguration(
        footer_key="footer_key", column_keys={"pii_key": ["ssn", "email"], "finance_key": ["balance"]})
    dp = cf.file_decryption_properties(mf.KMS_CONN, pe.DecryptionConfiguration())

    def run_clearice(name):
        clearice(f"DROP TABLE IF EXISTS lake.b.{name}")
        t = time.perf_counter()
        clearice(f"CREATE TABLE lake.b.{name} AS SELECT * FROM '{src}'")
        return time.perf_counter() - t

    def run_pyarrow():
        try:
            cat.drop_table("b.py")
        except Exception:  # noqa: BLE001 - not there yet
            pass
        t = time.perf_counter()
        data = pq.read_table(src)
        ice = cat.create_table("b.py", schema=data.schema)
        uri = f"{ice.location()}/data/00000-py.parquet"
        path = Path(uri[len("file://"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        ep = cf.file_encryption_properties(mf.KMS_CONN, config)
        pq.write_table(data, path, encryption_properties=ep, row_group_size=1 << 20)
        df = mf.data_file_for_encrypted_parquet(ice, uri, path, dp)
        with ice.transaction() as tx:
            with tx.update_snapshot().fast_append() as fa:
                fa.append_data_file(df)
        return time.perf_counter() - t

    engines = [("ClearIce encrypted", lambda: run_clearice("enc")),
               ("ClearIce plaintext", lambda: run_clearice("plain")),
               ("PyArrow + PyIceberg encrypted", run_pyarrow)]
    times = {n: [] for n, _ in engines}
    for r in range(args.runs):
        order = engines[r % 3:] + engines[:r % 3]
        for name, fn in order:
            times[name].append(fn())
            print(f"run {r}: {name}: {times[name][-1]:.2f}s", file=sys.stderr)
    # Same rows everywhere before any time is reported.
    n = subprocess.run([args.clearice, "--config", str(tmp / "clearice.toml"), "--user", "bench", "-q",
                        "--format", "csv", "-c",
                        "SELECT (SELECT count(*) FROM lake.b.enc) AS e, (SELECT count(*) FROM lake.b.plain) AS p, "
                        "(SELECT count(*) FROM lake.b.py) AS y, "
                        "(SELECT sum(CAST(round(balance * 100) AS BIGINT)) FROM lake.b.enc) = "
                        "(SELECT sum(CAST(round(balance * 100) AS BIGINT)) FROM lake.b.py) AS same"],
                       check=True, capture_output=True, text=True).stdout.splitlines()[1]
    e, p, y, same = n.split(",")
    assert int(e) == int(p) == int(y) == args.rows and same == "true", n
    med = {k: statistics.median(v) for k, v in times.items()}
    enc, plain, py = med["ClearIce encrypted"], med["ClearIce plaintext"], med["PyArrow + PyIceberg encrypted"]
    print(f"| rows | ClearIce encrypted | ClearIce plaintext | PyArrow + PyIceberg encrypted | encrypted / plaintext | ClearIce / PyArrow |")
    print("|---|---|---|---|---|---|")
    print(f"| {args.rows:,} | {enc:.2f} s | {plain:.2f} s | {py:.2f} s | **{enc / plain:.2f}×** | **{enc / py:.2f}×** |")


if __name__ == "__main__":
    main()
