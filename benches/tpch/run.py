#!/usr/bin/env python3
"""TPC-H over PME-encrypted Iceberg tables: ClearIce against bare DataFusion and DuckDB.

One command (from the repository root, with the test venv of scripts/test.sh):

    target/clearice-test-cache/venv/bin/python benches/tpch/run.py [--sf 1] [--runs 3] [--results]

It builds the release binaries (`clearice` and the bench runner `compare`), generates the
eight TPC-H tables once per scale factor (`tpchgen-cli`), writes each with PyArrow twice,
plaintext and PME-encrypted by CryptoFactory (double wrapping, the interop keyring KMS;
see ENCRYPTED below), registers both sets as Iceberg tables (PyIceberg, a SQLite catalog:
`lake.tpch` and `lake.tpch_plain`), then runs the 22 queries (`queries/qN.sql`) on:

| engine | reads |
|---|---|
| ClearIce enc (`compare clearice`, the engine library) | `lake.tpch`, as `admin` (plaintext) |
| ClearIce plain | `lake.tpch_plain` |
| ClearIce CLI enc (`clearice -c`, a process per query) | `lake.tpch` |
| DataFusion plain (`compare datafusion`, DataFusion 53 with its defaults) | the plaintext files |
| DuckDB plain | the plaintext files (DuckDB cannot read PME) |

Every engine is one long-lived process (except the CLI); before any time is reported every
engine's answer to every query is checked equal to DuckDB's, row by row in the query's
order (decimals and floats to 1e-6 relative). Rounds rotate the engines' order; the median
per query is reported, and the total is the sum of the medians. `--results` writes the
table into benches/RESULTS.md between the tpch markers. `--sf 0.01 --runs 1 --cluster 3` is the
smoke test CI runs (benches/tests/tpch_smoke.rs).

`--cluster N` adds ClearIce as the coordinator of N `clearice worker` processes on loopback,
over mutual TLS (a CA and certificates made with openssl, a cluster secret): as `admin` it is
checked against DuckDB and timed like the others; as `analyst` (addresses hashed, phones
`show_last_4`) its answers are checked equal to one ClearIce process's, and q10's against
the admin's (they must differ: the masks are applied).
"""

import argparse
import base64
import datetime
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_compare():
    """The comparison harness (benches/compare/run.py): its data and worker helpers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_run", ROOT / "benches" / "compare" / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compare = _load_compare()

QUERIES = ROOT / "benches" / "tpch" / "queries"
TABLES = ["region", "nation", "supplier", "customer", "part", "partsupp", "orders", "lineitem"]
MASTER_KEYS = ["footer_key", "pii_key", "finance_key"]
# Who's who and how much they have: names, addresses and phones under `pii_key`; balances,
# prices, discounts and costs under `finance_key`. The footer is encrypted too.
ENCRYPTED = {
    "customer": {"pii_key": ["c_name", "c_address", "c_phone"], "finance_key": ["c_acctbal"]},
    "supplier": {"pii_key": ["s_name", "s_address", "s_phone"], "finance_key": ["s_acctbal"]},
    "orders": {"finance_key": ["o_totalprice"]},
    "lineitem": {"finance_key": ["l_extendedprice", "l_discount"]},
    "partsupp": {"finance_key": ["ps_supplycost"]},
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def queries(selected):
    # One line each: the workers speak a line protocol (the queries hold no `--` comments).
    return {n: " ".join((QUERIES / f"q{n}.sql").read_text().split()).rstrip(";") for n in selected}


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

# What the second principal, `analyst`, sees of the protected columns (plaintext otherwise).
ANALYST_MASKS = {"c_address": "sha256", "c_phone": "show_last_4", "s_address": "sha256",
                 "s_phone": "show_last_4"}


def policy():
    lines = ["[roles]", "admin = {}", "analyst = {}", "", "[users]", 'admin = { roles = ["admin"] }',
             'analyst = { roles = ["analyst"] }', "", "[files]", 'decrypt = ["admin"]']
    for table, keys in ENCRYPTED.items():
        for key, columns in keys.items():
            for c in columns:
                analyst = ANALYST_MASKS.get(c, "plaintext")
                lines += ["", f'[tables."lake.tpch.{table}".columns.{c}]', f'master_key = "{key}"',
                          f'access = {{ admin = "plaintext", analyst = "{analyst}" }}']
    return "\n".join(lines) + "\n"


def iceberg_schema(arrow_schema):
    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, DecimalType, IntegerType, LongType, NestedField, StringType

    def ice(t):
        import pyarrow as pa

        if pa.types.is_decimal(t):
            return DecimalType(t.precision, t.scale)
        return {"int64": LongType(), "int32": IntegerType(), "string": StringType(),
                "date32[day]": DateType()}[str(t)]

    return Schema(*[
        NestedField(int(f.metadata[b"PARQUET:field_id"]), f.name, ice(f.type), required=not f.nullable)
        for f in arrow_schema
    ])


def generate(work, sf, int_decimals=False):
    """Writes the tables into `work` (once per scale factor and decimal layout)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import pyarrow.parquet.encryption as pe
    from pyiceberg.catalog.sql import SqlCatalog

    mf = compare.load_make_fixtures()
    if work.exists():
        shutil.rmtree(work)
    raw = work / "raw"
    for d in ["plain", "enc"]:
        (work / d).mkdir(parents=True)
    t0 = time.perf_counter()
    tpchgen = Path(sys.executable).parent / "tpchgen-cli"
    subprocess.run([str(tpchgen), "parquet", "-s", str(sf), "--output-dir", str(raw)], check=True)
    keys = {k: os.urandom(16) for k in MASTER_KEYS}
    (work / "keyring.json").write_text(json.dumps({k: base64.b64encode(v).decode() for k, v in keys.items()}))
    cf = mf.crypto_factory(keys)
    warehouse = work / "warehouse"
    warehouse.mkdir()
    cat = SqlCatalog("lake", uri=f"sqlite:///{work / 'catalog.db'}", warehouse=f"file://{warehouse}")
    cat.create_namespace("tpch")
    cat.create_namespace("tpch_plain")
    dp = cf.file_decryption_properties(mf.KMS_CONN, pe.DecryptionConfiguration())
    for table in TABLES:
        source = pq.ParquetFile(raw / f"{table}.parquet")
        # tpchgen writes Utf8View; Iceberg's string is Utf8 (what PyArrow writes by default).
        schema = pa.schema([f.with_type(pa.string()) if f.type == pa.string_view() else f
                            for f in source.schema_arrow])
        plain, enc = work / "plain" / f"{table}.parquet", work / "enc" / f"{table}.parquet"
        props = None
        if table in ENCRYPTED:
            config = pe.EncryptionConfiguration(footer_key="footer_key", column_keys=ENCRYPTED[table])
            props = cf.file_encryption_properties(mf.KMS_CONN, config)
        # Streamed a row group (PyArrow's default 1Mi rows) at a time: SF10's lineitem
        # does not fit in memory twice.
        # PyArrow stores decimals as FIXED_LEN_BYTE_ARRAY unless told to use INT32/INT64
        # (`store_decimal_as_integer`, what parquet-rs, Spark and Iceberg Java write).
        layout = {"compression": "snappy", "store_decimal_as_integer": int_decimals}
        with pq.ParquetWriter(plain, schema, **layout) as wp, \
                pq.ParquetWriter(enc, schema, encryption_properties=props, **layout) as we:
            for batch in source.iter_batches(batch_size=1 << 20):
                chunk = pa.Table.from_batches([batch]).cast(schema)
                wp.write_table(chunk)
                we.write_table(chunk)
        for ns, path, decrypt in [("tpch", enc, dp if props else None), ("tpch_plain", plain, None)]:
            ice = cat.create_table(f"{ns}.{table}", schema=iceberg_schema(schema))
            df = mf.data_file_for_encrypted_parquet(ice, f"file://{path}", path, decrypt)
            with ice.transaction() as tx:
                with tx.update_snapshot().fast_append() as fa:
                    fa.append_data_file(df)
    shutil.rmtree(raw)
    (work / "policy.toml").write_text(policy())
    (work / "clearice.toml").write_text(
        f'[catalogs.lake]\ntype = "sql"\nuri = "sqlite://{work / "catalog.db"}"\nwarehouse = "file://{warehouse}"\n\n'
        '[kms]\ntype = "keyring"\npath = "keyring.json"\n\n[policy]\npath = "policy.toml"\n')
    size = lambda d: sum(f.stat().st_size for f in (work / d).iterdir()) / 1e6  # noqa: E731
    log(f"data: TPC-H SF{sf}, plaintext {size('plain'):.0f} MB, encrypted {size('enc'):.0f} MB "
        f"({time.perf_counter() - t0:.0f} s)")
    (work / "sf").write_text(data_tag(sf, int_decimals))


def data_tag(sf, int_decimals):
    """What `work/sf` records of the data: the scale factor and the decimal layout."""
    return f"{sf} int-decimals" if int_decimals else str(sf)


# --------------------------------------------------------------------------
# Engines
# --------------------------------------------------------------------------

class Cli:
    """`clearice -c`: a process per query, as a script would run it."""

    def __init__(self, name, binary, config, namespace):
        self.name, self.binary, self.config = name, binary, config
        catalog, schema = namespace.split(".")
        self.prefix = ["-c", f"SET datafusion.catalog.default_catalog = '{catalog}'",
                       "-c", f"SET datafusion.catalog.default_schema = '{schema}'"]

    def _exec(self, sql):
        start = time.perf_counter()
        out = subprocess.run([self.binary, "--config", self.config, "--user", "admin", "-q", "--format", "csv",
                              *self.prefix, "-c", sql], check=True, capture_output=True, text=True).stdout
        return time.perf_counter() - start, out

    def run_sql(self, sql):
        seconds, out = self._exec(sql)
        return seconds, max(len(out.splitlines()) - 1, 0)

    def rows(self, sql):
        import csv
        import io

        return [tuple(r) for r in list(csv.reader(io.StringIO(self._exec(sql)[1])))[1:]]

    def close(self):
        pass


class Sql(compare.Worker):
    """A long-lived worker answering `RUN\\tsql` and `DUMP\\tpath\\tsql`."""

    def rows(self, sql, path):
        import pyarrow.ipc as ipc

        self.ask(f"DUMP\t{path}\t{sql}")
        with ipc.open_file(path) as f:
            return compare.rows_of(f.read_all())


def duckdb_worker(data, memory_limit_mb):
    """DuckDB over the plaintext files, one view per table."""
    import duckdb
    import pyarrow.ipc as ipc

    con = duckdb.connect()
    if memory_limit_mb:
        con.execute(f"SET memory_limit = '{memory_limit_mb}MiB'")
    for t in TABLES:
        con.execute(f"CREATE VIEW {t} AS SELECT * FROM read_parquet('{Path(data) / f'{t}.parquet'}')")
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *rest = line.rstrip("\n").split("\t")
        try:
            start = time.perf_counter()
            result = con.sql(rest[-1]).to_arrow_table()
            seconds = time.perf_counter() - start
            if cmd == "DUMP":
                with ipc.new_file(rest[0], result.schema) as w:
                    w.write_table(result)
                print("ok", flush=True)
            else:
                print(f"{seconds:.6f} {result.num_rows}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the harness
            print(f"error {type(e).__name__}: {e}".replace("\n", " "), flush=True)


# --------------------------------------------------------------------------
# Checking answers
# --------------------------------------------------------------------------

def same(a, b):
    """One value against DuckDB's: numbers to 1e-6 relative (DataFusion's decimal `avg` keeps
    6 digits, DuckDB's is a double), CSV text by its number or its text."""
    a, b = compare.canonical(a), compare.canonical(b)
    if a == "" and b is None:
        return True  # CSV writes NULL as an empty field
    if isinstance(a, str) and not isinstance(b, str):
        if isinstance(b, (int, float)):
            try:
                a = float(a)
            except ValueError:
                return False
        else:
            return a == str(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-6)
    return a == b


def check(name, q, got, want, peer="DuckDB"):
    if len(got) != len(want):
        raise SystemExit(f"{name} q{q}: {len(got)} rows, {peer} {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        if len(g) != len(w) or not all(same(x, y) for x, y in zip(g, w)):
            raise SystemExit(f"{name} q{q}: row {i} differs: {g} vs {peer} {w}")


# --------------------------------------------------------------------------
# A cluster: `clearice worker` processes over mutual TLS on loopback
# --------------------------------------------------------------------------

def cluster_certs(d):
    """A CA and one certificate for every process (loopback names), made with openssl."""
    d.mkdir(parents=True, exist_ok=True)

    def ssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
        "-subj", "/CN=clearice bench CA", "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    ssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=node",
        "-keyout", str(d / "node.key"), "-out", str(d / "node.csr"))
    (d / "node.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                "extendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\n")
    ssl("x509", "-req", "-in", str(d / "node.csr"), "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
        "-CAcreateserial", "-days", "2", "-extfile", str(d / "node.ext"), "-out", str(d / "node.pem"))


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(work, clearice, n):
    """`n` workers over mutual TLS; returns (coordinator config, worker processes)."""
    d = work / "cluster"
    cluster_certs(d)
    (d / "secret").write_text(base64.b16encode(os.urandom(32)).decode())
    ports = [free_port() for _ in range(n)]
    urls = ", ".join(f'"https://127.0.0.1:{p}"' for p in ports)
    config = d / "clearice.toml"
    config.write_text((work / "clearice.toml").read_text()
                      .replace('path = "keyring.json"', f'path = "{work / "keyring.json"}"')
                      .replace('path = "policy.toml"', f'path = "{work / "policy.toml"}"')
                      + f'\n[cluster]\nworkers = [{urls}]\nsecret_file = "secret"\n'
                      'tls_cert = "node.pem"\ntls_key = "node.key"\ntls_ca = "ca.pem"\n')
    procs = []
    for i, p in enumerate(ports):
        addr = d / f"worker{i}.addr"
        addr.unlink(missing_ok=True)
        procs.append(subprocess.Popen([clearice, "--config", str(config), "worker", "--addr",
                                       f"127.0.0.1:{p}", "--addr-file", str(addr)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        deadline = time.monotonic() + 120
        while not (addr.exists() and addr.read_text()):
            if procs[-1].poll() is not None:
                raise SystemExit(f"worker {i} did not start: {procs[-1].stderr.read().decode()[-2000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"worker {i} did not start within 120 s")
            time.sleep(0.1)
    log(f"cluster: {n} workers over mutual TLS on ports {ports}")
    return str(config), procs


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sf", default="1", help="scale factor (tpchgen-cli's -s)")
    ap.add_argument("--runs", type=int, default=3, help="rounds (median reported)")
    ap.add_argument("--work", type=Path, default=None, help="data directory (default target/tpch/SF)")
    ap.add_argument("--bin-dir", type=Path, default=None, help="skip the build; binaries here")
    ap.add_argument("--queries", default=",".join(str(n) for n in range(1, 23)))
    ap.add_argument("--no-cli", action="store_true", help="skip the CLI (a process per query)")
    ap.add_argument("--cluster", type=int, default=0, metavar="N",
                    help="also run ClearIce as a coordinator of N `clearice worker` processes over mutual "
                         "TLS (as admin, checked against DuckDB, and as analyst, checked against one process)")
    ap.add_argument("--results", action="store_true", help="write the table into benches/RESULTS.md")
    ap.add_argument("--int-decimals", action="store_true",
                    help="write decimals as INT64 (PyArrow's store_decimal_as_integer) instead of PyArrow's "
                         "default FIXED_LEN_BYTE_ARRAY; data in target/tpch/SF-int-decimals")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL:NAME=VALUE[,NAME=VALUE]",
                    help="also run ClearIce enc with these session options (`SET NAME = VALUE`), labelled "
                         "`ClearIce enc LABEL`, checked and timed like the others (repeatable)")
    ap.add_argument("--memory-limit", type=int, default=0,
                    help="MiB each engine's memory pool may hold (ClearIce `[execution] memory_limit_mb`, "
                    "DataFusion's FairSpillPool, DuckDB's memory_limit); 0: none")
    args = ap.parse_args()

    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if args.bin_dir is None:
        log("building release binaries (cargo build --release -p clearice-cli -p clearice-benches)")
        subprocess.run(["cargo", "build", "--release", "-p", "clearice-cli", "-p", "clearice-benches",
                        "--bin", "clearice", "--bin", "compare"], cwd=ROOT, check=True)
        args.bin_dir = target / "release"
    default_work = target / "tpch" / (f"{args.sf}-int-decimals" if args.int_decimals else args.sf)
    work = (args.work or default_work).resolve()
    if not (work / "sf").exists() or (work / "sf").read_text() != data_tag(args.sf, args.int_decimals):
        generate(work, args.sf, args.int_decimals)
    (work / "policy.toml").write_text(policy())
    config = str(work / "clearice.toml")
    if args.memory_limit:
        # The same config with the process's memory pool bounded (`[execution]`).
        limited = work / f"clearice-{args.memory_limit}mb.toml"
        limited.write_text((work / "clearice.toml").read_text()
                           + f"\n[execution]\nmemory_limit_mb = {args.memory_limit}\n")
        config = str(limited)
    bins = str(args.bin_dir / "compare"), str(args.bin_dir / "clearice")
    qs = queries([int(n) for n in args.queries.split(",")])

    def clearice(ns, user="admin", cfg=config):
        argv = [bins[0], "clearice", "--config", cfg, "--user", user, "--namespace", ns]
        return argv + (["--distributed"] if cfg != config else [])

    datafusion = [bins[0], "datafusion", "--keyring", str(work / "keyring.json")]
    if args.memory_limit:
        datafusion += ["--memory-limit", str(args.memory_limit)]
    for t in TABLES:
        datafusion += ["--table", f"{t}={work / 'plain' / t}.parquet"]
    workers = [
        Sql("ClearIce enc", clearice("lake.tpch"), {}),
        Sql("ClearIce plain", clearice("lake.tpch_plain"), {}),
        Sql("DataFusion plain", datafusion, {}),
    ]
    for v in args.variant:
        label, _, sets = v.partition(":")
        w = Sql(f"ClearIce enc {label}", clearice("lake.tpch"), {})
        for kv in sets.split(","):
            name, _, value = kv.partition("=")
            w.run_sql(f"SET {name.strip()} = {value.strip()}")
        workers.append(w)
    duck = Sql("DuckDB plain", [sys.executable, __file__, "--worker", str(work / "plain"),
                                str(args.memory_limit or 0)], {})
    cli = [] if args.no_cli else [Cli("ClearIce CLI enc", bins[1], config, "lake.tpch")]
    # With --cluster: the coordinator as admin (timed, checked against DuckDB), and the
    # analyst's masked answers on one process and on the cluster (checked against each other).
    cluster_procs, pairs = [], []
    if args.cluster:
        cluster_config, cluster_procs = start_cluster(work, bins[1], args.cluster)
        workers.append(Sql(f"ClearIce {args.cluster} workers enc", clearice("lake.tpch", cfg=cluster_config), {}))
        pairs.append((Sql("ClearIce enc (analyst)", clearice("lake.tpch", "analyst"), {}),
                      Sql(f"ClearIce {args.cluster} workers enc (analyst)",
                          clearice("lake.tpch", "analyst", cluster_config), {})))
    try:
        run(args, work, qs, workers, duck, cli, pairs)
    finally:
        for p in cluster_procs:
            p.kill()
            p.wait()


def run(args, work, qs, workers, duck, cli, pairs):
    log("checking answers against DuckDB")
    # A peer that refuses a query (bare DataFusion over a memory limit) is reported as
    # refused; ClearIce refusing one fails the run.
    refused = {}
    for q, sql in qs.items():
        want = duck.rows(sql, str(work / "want.arrow"))
        for w in workers:
            try:
                got = w.rows(sql, str(work / "got.arrow"))
            except SystemExit as e:
                if w.name.startswith("ClearIce"):
                    raise
                refused[(w.name, q)] = str(e)
                log(f"{w.name} q{q} refused: {str(e)[:300]}")
                continue
            check(w.name, q, got, want)
        for c in cli:
            check(c.name, q, c.rows(sql), want)
        for one, many in pairs:
            masked = one.rows(sql, str(work / "want.arrow"))
            check(many.name, q, many.rows(sql, str(work / "got.arrow")), masked, peer=one.name)
            if q == 10:
                # q10 returns c_address and c_phone: the analyst sees them masked.
                try:
                    check(one.name, q, masked, want)
                except SystemExit:
                    pass
                else:
                    raise SystemExit(f"{one.name} q10: the analyst's answer is the admin's (no masks)")
    engines = workers + [duck] + cli
    times = {(e.name, q): [] for e in engines for q in qs}
    for r in range(args.runs):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for q, sql in qs.items():
            for e in order:
                if (e.name, q) not in refused:
                    times[(e.name, q)].append(e.run_sql(sql)[0])
        log(f"round {r + 1}/{args.runs} done")
    fixed = fixed_cost(workers) if args.cluster else None
    peaks = {e.name: peak_rss_mib(e) for e in workers + [duck]}
    for e in engines + [w for pair in pairs for w in pair]:
        e.close()
    med = {k: statistics.median(v) for k, v in times.items() if v}
    lines = report(args, work, [e.name for e in engines], qs, med)
    for (name, q), why in sorted(refused.items(), key=lambda kv: kv[0][1]):
        lines.append(f"- {name} refused q{q}: `{why.split(': ', 2)[-1][:240]}`")
    lines.append("")
    lines.append("Peak RSS per process over the whole run"
                 + (f" (memory pools {args.memory_limit} MiB)" if args.memory_limit else "") + ": "
                 + ", ".join(f"{n} {p:,.0f} MiB" for n, p in peaks.items()) + ".")
    if fixed:
        lines.append("")
        lines.append(fixed)
    print("\n".join(lines))
    if args.results:
        compare.write_results(lines, "tpch", heading="TPC-H over encrypted Iceberg (`benches/tpch/run.py`)")


def fixed_cost(workers, n=30):
    """The fixed cost of a distributed query: a scan of the 5-row `region` table, `n` times on
    one process and on the cluster (medians, after a warm-up each)."""
    sql = "SELECT count(*), min(r_name) FROM region"
    one, many = workers[0], workers[-1]
    med = {}
    for w in (one, many):
        w.run_sql(sql)
        med[w.name] = statistics.median(w.run_sql(sql)[0] for _ in range(n))
    return (f"Fixed cost of a distributed query (`{sql}`, median of {n}): {one.name} "
            f"{med[one.name] * 1e3:.1f} ms, {many.name} {med[many.name] * 1e3:.1f} ms: "
            f"**+{(med[many.name] - med[one.name]) * 1e3:.1f} ms** per query.")


def peak_rss_mib(worker):
    """The worker process's peak resident set (Linux `VmHWM`), in MiB."""
    if worker.proc.poll() is not None:
        return float("nan")  # it died: no figure
    for line in Path(f"/proc/{worker.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def report(args, work, names, qs, med):
    import duckdb
    import pyarrow

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    size = lambda d: sum(f.stat().st_size for f in (work / d).iterdir()) / 1e6  # noqa: E731
    enc, plain, df, dd = "ClearIce enc", "ClearIce plain", "DataFusion plain", "DuckDB plain"
    lines = [
        f"Machine: {os.cpu_count()} vCPU {cpu}, {platform.system()} {platform.release()}; "
        f"{datetime.date.today()}; pyarrow {pyarrow.__version__}, duckdb {duckdb.__version__}.",
        f"Command: `python benches/tpch/run.py --sf {args.sf} --runs {args.runs}"
        + (f" --memory-limit {args.memory_limit}" if args.memory_limit else "")
        + (" --int-decimals" if args.int_decimals else "")
        + "".join(f" --variant '{v}'" for v in args.variant) + f"` (median of {args.runs} rounds, "
        "engines in rotating order, every answer checked equal to DuckDB's first).",
        f"Data: TPC-H SF{args.sf} by tpchgen-cli, rewritten by PyArrow (Snappy, its default row groups, "
        + ("decimals as INT64" if args.int_decimals else "decimals as FIXED_LEN_BYTE_ARRAY, its default") + "): "
        f"plaintext {size('plain'):.0f} MB; encrypted {size('enc'):.0f} MB ("
        + "; ".join(f"{t}: " + ", ".join(f"`{c}`" for cs in k.values() for c in cs) for t, k in ENCRYPTED.items())
        + "; names, addresses and phones under `pii_key`, money under `finance_key`, encrypted footers).",
        "",
        "| query | " + " | ".join(names) + f" | enc / {df} | enc / {dd} | enc / plain |",
        "|---|" + "---|" * (len(names) + 3),
    ]
    # Totals over the queries every engine answered (a refused query has no time).
    done = [q for q in qs if all((n, q) in med for n in names)]
    total = {n: sum(med[(n, q)] for q in done) for n in names}
    shown = lambda n, q: f"{med[(n, q)]:.3f}" if (n, q) in med else "refused"  # noqa: E731
    ratio = lambda a, b, q: f"{med[(a, q)] / med[(b, q)]:.2f}" if (b, q) in med else "—"  # noqa: E731
    for q in qs:
        lines.append(f"| q{q} | " + " | ".join(shown(n, q) for n in names)
                     + f" | {ratio(enc, df, q)} | {ratio(enc, dd, q)} | {ratio(enc, plain, q)} |")
    label = "total" if len(done) == len(qs) else f"total of the {len(done)} queries all answered"
    lines.append(f"| **{label}** | " + " | ".join(f"**{total[n]:.2f} s**" for n in names)
                 + f" | **{total[enc] / total[df]:.2f}×** | **{total[enc] / total[dd]:.2f}×** "
                 f"| **{total[enc] / total[plain]:.2f}×** |")
    if len(done) < len(qs):
        lines.append("| sum of the queries each engine answered (not comparable) | " + " | ".join(
            f"{sum(med[(n, q)] for q in qs if (n, q) in med):.2f} s" for n in names) + " | | | |")
    return lines


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        duckdb_worker(sys.argv[2], int(sys.argv[3]))
    else:
        main()
