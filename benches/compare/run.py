#!/usr/bin/env python3
"""ClearIce against the engines a user would pick instead, on one PME-encrypted dataset.

One command (from the repository root, with the test venv of scripts/test.sh):

    target/clearice-test-cache/venv/bin/python benches/compare/run.py [--rows 5000000] [--runs 5]

It builds the release binaries (`clearice`, and the bench runner `compare`), generates a
payments dataset once per row count (PyArrow: a plaintext file and its twin encrypted per
column with PME through CryptoFactory, double wrapping, the interop keyring KMS; both
registered as Iceberg tables by PyIceberg in a SQLite catalog), then times the workloads
below in one run. Every engine is one long-lived process that runs each statement warm:

| engine | reads |
|---|---|
| ClearIce in-process (`compare clearice`, the engine library) | the files by path and the Iceberg tables, encrypted and plaintext, and the table Iceberg encrypts itself (`payments_native`, made by ClearIce's `CREATE TABLE ... WITH ("encryption.key-id" = ...) AS`); masked as `analyst` |
| ClearIce CLI (`clearice -c`, a process per statement) | the encrypted file |
| bare DataFusion 53 (`compare datafusion`, parquet-rs PME, a KMS `EncryptionFactory`) | both files |
| PyArrow 26 + CryptoFactory (`pq.read_table` + compute) | both files |
| DuckDB (plaintext only: it cannot read PME) | the plaintext file |

Rounds alternate the order of the engines; each statement is timed per round and the
median is reported. Before any time is reported every engine's result of every workload
is checked equal to DuckDB's (rows sorted, floats to 1e-9 relative). Prints a Markdown
table with the ratios of the issue's goals and the KMS unwraps per engine, and with
--results writes them into benches/RESULTS.md between the compare markers.
"""

import argparse
import base64
import csv
import datetime
import io
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
SHARED = Path(os.environ.get("CLEARICE_SHARED", ROOT.parent / "shared"))
MASTER_KEYS = ["footer_key", "pii_key", "finance_key"]

# Workloads: SQL for the SQL engines ({p}: payments, {a}: accounts), a PyArrow function.
WORKLOADS = {
    "W1": (
        "decode every column, small result",
        "SELECT count(*) AS n, sum(payment_id) AS ids, sum(length(account)) AS accounts, "
        "sum(amount) AS amount, sum(length(currency)) AS currencies, "
        "sum(date_part('day', paid_on)) AS days, sum(length(card_number)) AS cards, "
        "sum(length(merchant)) AS merchants FROM {p}",
    ),
    "W2": (
        "GROUP BY currency, sum(amount) (encrypted)",
        "SELECT currency, sum(amount) AS total FROM {p} GROUP BY currency ORDER BY currency",
    ),
    "W3": (
        "1 % filter on a plaintext date, encrypted columns out",
        "SELECT payment_id, account, amount, card_number FROM {p} "
        "WHERE paid_on BETWEEN DATE '2024-03-01' AND DATE '2024-03-07'",
    ),
    "JOIN": (
        "join on an encrypted column with a 100k-row dimension, grouped",
        "SELECT a.region, count(*) AS n, sum(p.amount) AS total FROM {p} p "
        "JOIN {a} a ON p.account = a.account GROUP BY a.region ORDER BY a.region",
    ),
    "TOPK": (
        "ORDER BY encrypted amount LIMIT 10",
        "SELECT payment_id, card_number, amount FROM {p} ORDER BY amount DESC, payment_id LIMIT 10",
    ),
}

POLICY = """
[roles]
admin = {}
analyst = {}

[users]
admin = { roles = ["admin"] }
analyst = { roles = ["analyst"] }

[files]
decrypt = ["admin"]

[tables."lake.bench.payments".columns.account]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "sha256" }

[tables."lake.bench.payments".columns.card_number]
master_key = "pii_key"
access = { admin = "plaintext", analyst = "show_last_4" }

[tables."lake.bench.payments".columns.amount]
master_key = "finance_key"
access = { admin = "plaintext", analyst = "plaintext" }

[writes]
create = ["admin"]
""" + "".join(
    # The table Iceberg encrypts itself (format 3, every column under the table key),
    # which ClearIce creates from the plaintext twin: every column named, as it must be.
    f'\n[tables."lake.bench.payments_native".columns.{c}]\n'
    f'access = {{ admin = "plaintext", analyst = "{m}" }}\nwrite = ["admin"]\n'
    for c, m in [("payment_id", "plaintext"), ("account", "sha256"), ("amount", "plaintext"),
                 ("currency", "plaintext"), ("paid_on", "plaintext"), ("card_number", "show_last_4"),
                 ("merchant", "plaintext")])
NATIVE_KEY = "finance_key"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------

def load_make_fixtures():
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", SHARED / "interop" / "make_fixtures.py")
    mf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mf)
    return mf


def payments(rows):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(16)

    def padded(prefix, values, width):
        s = pc.utf8_lpad(pa.array(values).cast(pa.string()), width, "0")
        return pc.binary_join_element_wise(pa.scalar(prefix), s, "")

    fields = [
        ("payment_id", pa.int64(), False),
        ("account", pa.string(), True),
        ("amount", pa.float64(), True),
        ("currency", pa.string(), True),
        ("paid_on", pa.date32(), True),
        ("card_number", pa.string(), True),
        ("merchant", pa.string(), True),
    ]
    currencies = np.array(["EUR", "USD", "GBP", "CHF", "JPY"])
    columns = [
        pa.array(np.arange(rows, dtype=np.int64)),
        padded("ACC", rng.integers(0, 100_000, rows), 7),
        pa.array(rng.integers(1, 10_000_000, rows) / 100.0),
        pa.array(currencies[rng.choice(5, rows, p=[0.4, 0.3, 0.15, 0.1, 0.05])]),
        pa.array((np.datetime64("2024-01-01") + rng.integers(0, 730, rows)).astype("datetime64[D]")),
        padded("4", rng.integers(0, 10**15, rows), 15),
        padded("merchant-", rng.integers(0, 2_000, rows), 4),
    ]
    schema = pa.schema([
        pa.field(n, t, nullable=nullable, metadata={b"PARQUET:field_id": str(i + 1).encode()})
        for i, (n, t, nullable) in enumerate(fields)
    ])
    return pa.Table.from_arrays(columns, schema=schema)


def accounts():
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(17)
    regions = np.array(["north", "south", "east", "west", "central", "overseas"])
    ids = pc.utf8_lpad(pa.array(np.arange(100_000)).cast(pa.string()), 7, "0")
    return pa.table({
        "account": pc.binary_join_element_wise(pa.scalar("ACC"), ids, ""),
        "region": pa.array(regions[rng.integers(0, len(regions), 100_000)]),
    })


def iceberg_schema(arrow_schema):
    from pyiceberg.schema import Schema
    from pyiceberg.types import DateType, DoubleType, LongType, NestedField, StringType

    types = {"int64": LongType(), "string": StringType(), "double": DoubleType(), "date32[day]": DateType()}
    return Schema(*[
        NestedField(int(f.metadata[b"PARQUET:field_id"]), f.name, types[str(f.type)], required=not f.nullable)
        for f in arrow_schema
    ])


def generate(work, rows):
    """Writes the dataset into `work` (once per row count)."""
    import pyarrow.parquet as pq
    import pyarrow.parquet.encryption as pe
    from pyiceberg.catalog.sql import SqlCatalog

    mf = load_make_fixtures()
    if work.exists():
        shutil.rmtree(work)
    (work / "data").mkdir(parents=True)
    keys = {k: os.urandom(16) for k in MASTER_KEYS}
    (work / "keyring.json").write_text(json.dumps({k: base64.b64encode(v).decode() for k, v in keys.items()}))
    t0 = time.perf_counter()
    table = payments(rows)
    groups = max(rows // 20, 1)  # 20 row groups, Snappy, PyArrow's defaults otherwise
    pq.write_table(table, work / "data" / "plain.parquet", row_group_size=groups, compression="snappy")
    cf = mf.crypto_factory(keys)
    config = pe.EncryptionConfiguration(
        footer_key="footer_key",
        column_keys={"pii_key": ["account", "card_number"], "finance_key": ["amount"]},
    )
    pq.write_table(table, work / "data" / "enc.parquet", row_group_size=groups, compression="snappy",
                   encryption_properties=cf.file_encryption_properties(mf.KMS_CONN, config))
    pq.write_table(accounts(), work / "data" / "accounts.parquet", compression="snappy")
    log(f"data: {rows} rows, plain {os.path.getsize(work / 'data' / 'plain.parquet') / 1e6:.0f} MB, "
        f"encrypted {os.path.getsize(work / 'data' / 'enc.parquet') / 1e6:.0f} MB ({time.perf_counter() - t0:.0f} s)")

    warehouse = work / "warehouse"
    warehouse.mkdir()
    cat = SqlCatalog("lake", uri=f"sqlite:///{work / 'catalog.db'}", warehouse=f"file://{warehouse}")
    cat.create_namespace("bench")
    dp = cf.file_decryption_properties(mf.KMS_CONN, pe.DecryptionConfiguration())
    for name, file, props in [("payments", "enc.parquet", dp), ("payments_plain", "plain.parquet", None)]:
        ice = cat.create_table(f"bench.{name}", schema=iceberg_schema(table.schema))
        path = work / "data" / file
        df = mf.data_file_for_encrypted_parquet(ice, f"file://{path}", path, props)
        with ice.transaction() as tx:
            with tx.update_snapshot().fast_append() as fa:
                fa.append_data_file(df)
    (work / "policy.toml").write_text(POLICY)
    (work / "clearice.toml").write_text(
        f'[catalogs.lake]\ntype = "sql"\nuri = "sqlite://{work / "catalog.db"}"\nwarehouse = "file://{warehouse}"\n\n'
        '[kms]\ntype = "keyring"\npath = "keyring.json"\n\n[policy]\npath = "policy.toml"\n')
    (work / "rows").write_text(str(rows))


# --------------------------------------------------------------------------
# Engines: long-lived workers speaking `RUN\t<what>` → `<seconds> <rows>`
# --------------------------------------------------------------------------

class Worker:
    def __init__(self, name, argv, source, kind="sql", env=None):
        self.name, self.source, self.kind = name, source, kind
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     bufsize=1, env=env)
        first = self.proc.stdout.readline().strip()
        if first != "ready":
            raise SystemExit(f"{name}: did not start: {first!r}")

    def what(self, workload):
        if self.kind == "sql":
            return WORKLOADS[workload][1].format(**self.source)
        return f"{workload}:{self.source}"

    def ask(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        if answer.startswith("error") or not answer:
            raise SystemExit(f"{self.name}: {line[:120]}: {answer or 'worker died'}")
        return answer

    def run(self, workload):
        return self.run_sql(self.what(workload))

    def run_sql(self, sql):
        """Runs `sql` (for Python workers: `WORKLOAD:source`); returns (seconds, rows)."""
        seconds, rows = self.ask(f"RUN\t{sql}").split()
        return float(seconds), int(rows)

    def dump(self, workload, path):
        self.ask(f"DUMP\t{path}\t{self.what(workload)}")
        import pyarrow.ipc as ipc

        with ipc.open_file(path) as f:
            return f.read_all()

    def kms(self):
        return int(self.ask("KMS"))

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


class Cli:
    """`clearice -c SQL`: a process per statement, as a script would run it."""

    def __init__(self, name, binary, config, source):
        self.name, self.binary, self.config, self.source = name, binary, config, source

    def _exec(self, workload, fmt):
        sql = WORKLOADS[workload][1].format(**self.source)
        start = time.perf_counter()
        out = subprocess.run([self.binary, "--config", self.config, "--user", "admin", "-q", "--format", fmt,
                              "-c", sql], check=True, capture_output=True, text=True).stdout
        return time.perf_counter() - start, out

    def run(self, workload):
        seconds, out = self._exec(workload, "csv")
        return seconds, max(len(out.splitlines()) - 1, 0)

    def dump(self, workload, _path):
        return list(csv.reader(io.StringIO(self._exec(workload, "csv")[1])))[1:]

    def kms(self):
        return None

    def close(self):
        pass


def python_worker(kind, data):
    """A worker process for PyArrow or DuckDB: `RUN\tW1:enc` etc."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.ipc as ipc
    import pyarrow.parquet as pq

    data = Path(data)
    unwraps = [0]
    if kind == "duckdb":
        import duckdb

        con = duckdb.connect()

        def execute(workload, source):
            assert source == "plain", "DuckDB cannot read PME"
            if workload == "MASK":  # what the analyst's masks compute, for checking
                return con.sql(MASK_DUCKDB.format(p=f"read_parquet('{data / 'plain.parquet'}')")).to_arrow_table()
            sql = WORKLOADS[workload][1].format(p=f"read_parquet('{data / 'plain.parquet'}')",
                                                a=f"read_parquet('{data / 'accounts.parquet'}')")
            return con.sql(sql).to_arrow_table()
    else:
        import pyarrow.parquet.encryption as pe

        mf = load_make_fixtures()
        keyring = {k: base64.b64decode(v) for k, v in json.loads((data.parent / "keyring.json").read_text()).items()}

        class CountingKms(mf.KeyringKmsClient):
            def unwrap_key(self, wrapped_key, master_key_identifier):
                unwraps[0] += 1
                return super().unwrap_key(wrapped_key, master_key_identifier)

        cf = pe.CryptoFactory(lambda _config: CountingKms(keyring))
        dp = cf.file_decryption_properties(mf.KMS_CONN, pe.DecryptionConfiguration())
        dims = pq.read_table(data / "accounts.parquet")

        def read(source, columns, filters=None):
            kwargs = {"decryption_properties": dp} if source == "enc" else {}
            return pq.read_table(data / f"{source}.parquet", columns=columns, filters=filters, **kwargs)

        def execute(workload, source):
            if workload == "W1":
                t = read(source, None)
                return pa.table({
                    "n": [t.num_rows],
                    "ids": [pc.sum(t["payment_id"]).as_py()],
                    "accounts": [pc.sum(pc.utf8_length(t["account"])).as_py()],
                    "amount": [pc.sum(t["amount"]).as_py()],
                    "currencies": [pc.sum(pc.utf8_length(t["currency"])).as_py()],
                    "days": [pc.sum(pc.day(t["paid_on"])).as_py()],
                    "cards": [pc.sum(pc.utf8_length(t["card_number"])).as_py()],
                    "merchants": [pc.sum(pc.utf8_length(t["merchant"])).as_py()],
                })
            if workload == "W2":
                t = read(source, ["currency", "amount"])
                return t.group_by("currency").aggregate([("amount", "sum")]).sort_by("currency")
            if workload == "W3":
                lo, hi = datetime.date(2024, 3, 1), datetime.date(2024, 3, 7)
                return read(source, ["payment_id", "account", "amount", "card_number"],
                            [("paid_on", ">=", lo), ("paid_on", "<=", hi)])
            if workload == "JOIN":
                t = read(source, ["account", "amount"]).join(dims, "account")
                return (t.group_by("region").aggregate([([], "count_all"), ("amount", "sum")])
                        .select(["region", "count_all", "amount_sum"]).sort_by("region"))
            if workload == "TOPK":
                t = read(source, ["payment_id", "card_number", "amount"])
                keys = [("amount", "descending"), ("payment_id", "ascending")]
                return t.take(pc.select_k_unstable(t, k=10, sort_keys=keys)).sort_by(keys)
            raise ValueError(workload)

    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *rest = line.rstrip("\n").split("\t")
        try:
            if cmd == "KMS":
                print(unwraps[0] if kind == "pyarrow" else 0, flush=True)
                continue
            workload, source = rest[-1].split(":")
            start = time.perf_counter()
            result = execute(workload, source)
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
# Checking results
# --------------------------------------------------------------------------

def canonical(value):
    if isinstance(value, Decimal):
        return float(value) if value != value.to_integral_value() else int(value)
    return value


def rows_of(result):
    if isinstance(result, list):  # CSV rows (strings)
        return result
    cols = [result.column(i).to_pylist() for i in range(result.num_columns)]
    return [tuple(canonical(c[r]) for c in cols) for r in range(result.num_rows)]


def same(a, b):
    if isinstance(b, str) and not isinstance(a, str):
        a, b = b, a
    if isinstance(a, str) and not isinstance(b, str):  # CSV text against a typed value
        if isinstance(b, (int, float)):
            try:
                return math.isclose(float(a), float(b), rel_tol=1e-9)
            except ValueError:
                return False
        return a == str(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def sort_key(row):
    return tuple((v is None, str(round(v, 4)) if isinstance(v, float) else str(v)) for v in row)


def check(name, workload, got, want):
    g, w = sorted(rows_of(got), key=sort_key), sorted(rows_of(want), key=sort_key)
    if isinstance(got, list):  # CSV: sort its strings like typed values
        g = sorted(g, key=lambda r: tuple(_typed(v) for v in r))
        w = sorted(w, key=lambda r: tuple(_typed(v) for v in r))
    if len(g) != len(w):
        raise SystemExit(f"{name} {workload}: {len(g)} rows, DuckDB {len(w)}")
    for i, (rg, rw) in enumerate(zip(g, w)):
        if len(rg) != len(rw) or not all(same(x, y) for x, y in zip(rg, rw)):
            raise SystemExit(f"{name} {workload}: row {i} differs: {rg} vs DuckDB {rw}")


def _typed(v):
    if isinstance(v, str):
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)
    if isinstance(v, (int, float)):
        return (0, float(v), "")
    return (1, 0.0, str(v))


# --------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=5, help="rounds (median reported)")
    ap.add_argument("--work", type=Path, default=None, help="data directory (default target/compare/ROWS)")
    ap.add_argument("--bin-dir", type=Path, default=None, help="skip the build; binaries here")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--results", action="store_true", help="write the table into benches/RESULTS.md")
    ap.add_argument("--no-flight", action="store_true", help="skip the Flight SQL streaming comparison")
    args = ap.parse_args()

    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if args.bin_dir is None:
        log("building release binaries (cargo build --release -p clearice-cli -p clearice-benches)")
        subprocess.run(["cargo", "build", "--release", "-p", "clearice-cli", "-p", "clearice-benches",
                        "--bin", "clearice", "--bin", "compare"], cwd=ROOT, check=True)
        args.bin_dir = target / "release"
    work = args.work or target / "compare" / str(args.rows)
    if not (work / "rows").exists() or (work / "rows").read_text() != str(args.rows):
        generate(work, args.rows)
    data, config = work / "data", str(work / "clearice.toml")
    compare, clearice = str(args.bin_dir / "compare"), str(args.bin_dir / "clearice")
    if not (work / "native").exists():
        # Iceberg's own table encryption, written by ClearIce (CREATE TABLE AS from the
        # plaintext twin): every file under its own key, AGS1 manifests.
        (work / "policy.toml").write_text(POLICY)
        t0 = time.perf_counter()
        subprocess.run([clearice, "--config", config, "--user", "admin", "-q", "-c",
                        f"CREATE TABLE lake.bench.payments_native WITH (\"encryption.key-id\" = '{NATIVE_KEY}') "
                        "AS SELECT * FROM lake.bench.payments_plain"], check=True, cwd=work)
        log(f"native table: CREATE TABLE AS of {args.rows} rows in {time.perf_counter() - t0:.1f} s")
        (work / "native").write_text("")
    f = lambda n: f"'{data / n}'"  # noqa: E731
    me = [sys.executable, __file__]

    workers = [
        Worker("ClearIce file enc", [compare, "clearice", "--config", config, "--user", "admin"],
               {"p": f("enc.parquet"), "a": f("accounts.parquet")}),
        Worker("ClearIce file plain", [compare, "clearice", "--config", config, "--user", "admin"],
               {"p": f("plain.parquet"), "a": f("accounts.parquet")}),
        Worker("ClearIce iceberg enc", [compare, "clearice", "--config", config, "--user", "admin"],
               {"p": "lake.bench.payments", "a": f("accounts.parquet")}),
        Worker("ClearIce iceberg plain", [compare, "clearice", "--config", config, "--user", "admin"],
               {"p": "lake.bench.payments_plain", "a": f("accounts.parquet")}),
        Worker("ClearIce iceberg native", [compare, "clearice", "--config", config, "--user", "admin"],
               {"p": "lake.bench.payments_native", "a": f("accounts.parquet")}),
        Worker("DataFusion enc", [compare, "datafusion", "--keyring", str(work / "keyring.json"),
                                  "--table", f"p={data / 'enc.parquet'}:encrypted",
                                  "--table", f"a={data / 'accounts.parquet'}"], {"p": "p", "a": "a"}),
        Worker("DataFusion plain", [compare, "datafusion", "--keyring", str(work / "keyring.json"),
                                    "--table", f"p={data / 'plain.parquet'}",
                                    "--table", f"a={data / 'accounts.parquet'}"], {"p": "p", "a": "a"}),
        Worker("PyArrow enc", me + ["--worker", "pyarrow", str(data)], "enc", kind="py"),
        Worker("PyArrow plain", me + ["--worker", "pyarrow", str(data)], "plain", kind="py"),
        Worker("DuckDB plain", me + ["--worker", "duckdb", str(data)], "plain", kind="py"),
        Cli("ClearIce CLI enc", clearice, config, {"p": f("enc.parquet"), "a": f("accounts.parquet")}),
    ]
    workloads = args.workloads.split(",")
    # Steady state is the point: the KMS count after a first (cold) round must stay put.
    kms_cold = {}
    log("checking results against DuckDB")
    reference = next(w for w in workers if w.name == "DuckDB plain")
    for wl in workloads:
        want = reference.dump(wl, str(work / "want.arrow"))
        for w in workers:
            if w is not reference:
                check(w.name, wl, w.dump(wl, str(work / "got.arrow")), want)
    for w in workers:
        kms_cold[w.name] = w.kms()
    times = {(w.name, wl): [] for w in workers for wl in workloads}
    for r in range(args.runs):
        order = workers[r % len(workers):] + workers[:r % len(workers)]
        for wl in workloads:
            for w in order:
                times[(w.name, wl)].append(w.run(wl)[0])
        log(f"round {r + 1}/{args.runs} done")
    kms_warm = {w.name: w.kms() for w in workers}
    mask_lines = masks(args, work, compare, reference)
    for w in workers:
        w.close()

    med = {k: statistics.median(v) for k, v in times.items()}
    lines = report(args, work, workers, workloads, med, kms_cold, kms_warm)
    lines += mask_lines
    if not args.no_flight:
        lines += flight(args, work, compare, clearice)
    print("\n".join(lines))
    if args.results:
        write_results(lines, "compare")


def write_results(lines, marker, heading=None):
    """Puts `lines` into benches/RESULTS.md between `<!-- MARKER:begin/end -->` (appended,
    under `heading`, the first time)."""
    path = ROOT / "benches" / "RESULTS.md"
    text = path.read_text()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    block = f"{begin}\n" + "\n".join(lines) + f"\n{end}"
    if begin in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        title = f"## {heading}\n\n" if heading else ""
        text = text.rstrip("\n") + "\n\n" + title + block + "\n"
    path.write_text(text)
    log(f"written to {path}")


def report(args, work, workers, workloads, med, kms_cold, kms_warm):
    import duckdb
    import pyarrow

    names = [w.name for w in workers]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    lines = [
        f"Machine: {os.cpu_count()} vCPU {cpu}, {platform.system()} {platform.release()}; "
        f"{datetime.date.today()}; pyarrow {pyarrow.__version__}, duckdb {duckdb.__version__}.",
        f"Command: `python benches/compare/run.py --rows {args.rows} --runs {args.runs}` "
        f"(median of {args.runs} rounds, engines in rotating order, results checked equal first).",
        f"Data: {args.rows:,} rows, 7 columns, 20 row groups, Snappy; plaintext "
        f"{os.path.getsize(work / 'data' / 'plain.parquet') / 1e6:.0f} MB, PME "
        f"{os.path.getsize(work / 'data' / 'enc.parquet') / 1e6:.0f} MB (`account`, `card_number` under `pii_key`, "
        "`amount` under `finance_key`, encrypted footer, written by PyArrow's CryptoFactory).",
        "",
        "| workload | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for wl in workloads:
        lines.append(f"| {wl} | " + " | ".join(f"{med[(n, wl)]:.3f} s" for n in names) + " |")
    lines += ["", "| workload | ClearIce enc / plain (file) | iceberg enc / plain | ClearIce enc / DataFusion plain "
              "| ClearIce enc / PyArrow enc | ClearIce enc / DuckDB plain | iceberg enc / file enc "
              "| iceberg native / plain |",
              "|---|---|---|---|---|---|---|---|"]
    for wl in workloads:
        e = med[("ClearIce file enc", wl)]
        lines.append(
            f"| {wl} | {e / med[('ClearIce file plain', wl)]:.2f} | "
            f"{med[('ClearIce iceberg enc', wl)] / med[('ClearIce iceberg plain', wl)]:.2f} | "
            f"{e / med[('DataFusion plain', wl)]:.2f} | {e / med[('PyArrow enc', wl)]:.2f} | "
            f"{e / med[('DuckDB plain', wl)]:.2f} | {med[('ClearIce iceberg enc', wl)] / e:.2f} | "
            f"{med[('ClearIce iceberg native', wl)] / med[('ClearIce iceberg plain', wl)]:.2f} |")
    lines += ["", "KMS unwraps (after the checking round → after all rounds): " + ", ".join(
        f"{n} {kms_cold[n]} → {kms_warm[n]}" for n in names if kms_cold[n] is not None)]
    return lines


FLIGHT_SQL = "SELECT * FROM lake.bench.payments"
MASK_SQL = "SELECT payment_id, account, card_number FROM lake.bench.payments"
MASK_DUCKDB = ("SELECT payment_id, sha256(account) AS account, "
               "repeat('X', length(card_number) - 4) || right(card_number, 4) AS card_number FROM {p}")


def masks(args, work, compare, duck):
    """The full scan of the two masked columns (5M `sha256`, 5M `show_last_4`) as `analyst`
    against the same scan in plaintext as `admin`; the masked result is checked equal to
    DuckDB's `sha256()` and string functions over the plaintext twin first."""
    import pyarrow.compute as pc

    def sorted_strings(t):
        cols = [t.column(i).cast("string") for i in range(t.num_columns)]
        order = pc.sort_indices(t.column(0))
        return [c.take(order) for c in cols]

    admin = Worker("admin", [compare, "clearice", "--config", str(work / "clearice.toml"), "--user", "admin"], {})
    analyst = Worker("analyst", [compare, "clearice", "--config", str(work / "clearice.toml"), "--user", "analyst"], {})
    import pyarrow.ipc as ipc

    analyst.ask(f"DUMP\t{work / 'got.arrow'}\t{MASK_SQL}")
    with ipc.open_file(str(work / "got.arrow")) as f:
        got = f.read_all()
    want = duck.dump("MASK", str(work / "want.arrow"))
    for name, g, w in zip(["payment_id", "account", "card_number"], sorted_strings(got), sorted_strings(want)):
        if not g.equals(w):
            raise SystemExit(f"masked {name} differs from DuckDB's")
    # Each mask alone too: which one costs what.
    statements = [("both", MASK_SQL),
                  ("`sha256` only", "SELECT payment_id, account FROM lake.bench.payments"),
                  ("`show_last_4` only", "SELECT payment_id, card_number FROM lake.bench.payments")]
    t = {(w, s): [] for w in ["admin", "analyst"] for s, _ in statements}
    for r in range(args.runs):
        for label, sql in statements:
            for w in ([admin, analyst] if r % 2 == 0 else [analyst, admin]):
                t[(w.name, label)].append(w.run_sql(sql)[0])
    admin.close()
    analyst.close()
    lines = ["", f"Masks: `{MASK_SQL}` ({args.rows:,} rows), median of {args.runs}; the analyst sees `account` as "
             "`sha256`, `card_number` as `show_last_4` (checked equal to DuckDB's `sha256()` and `repeat`/`right` "
             "over the plaintext first), and each of the two columns alone:", "",
             "| columns | admin (plaintext) | analyst (masked) | masked / plaintext |", "|---|---|---|---|"]
    for label, _ in statements:
        a, m = statistics.median(t[("admin", label)]), statistics.median(t[("analyst", label)])
        bold = "**" if label == "both" else ""
        lines.append(f"| {label} | {a:.3f} s | {m:.3f} s | {bold}{m / a:.2f}×{bold} |")
    return lines


def flight(args, work, compare, clearice):
    """The whole encrypted table to a Python ADBC client over Flight SQL, against the same
    statement drained in process; the server's peak memory shows it does not buffer the
    result."""
    import adbc_driver_flightsql.dbapi as flightsql

    config = work / "clearice-serve.toml"
    users = subprocess.run([compare, "server-users", "admin"], check=True, capture_output=True,
                           text=True).stdout
    config.write_text((work / "clearice.toml").read_text() + '\n[server]\naddr = "127.0.0.1:0"\n' + users)
    addr_file = work / "flight.addr"
    addr_file.unlink(missing_ok=True)
    server = subprocess.Popen([clearice, "--config", str(config), "serve", "--addr", "127.0.0.1:0",
                               "--addr-file", str(addr_file)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if addr_file.exists() and addr_file.read_text().strip():
                break
            time.sleep(0.1)
        addr = addr_file.read_text().strip()
        conn = flightsql.connect(f"grpc://{addr}", db_kwargs={"username": "admin", "password": "admin"})
        local = Worker("in-process", [compare, "clearice", "--config", str(work / "clearice.toml"),
                                      "--user", "admin"], {})

        def over_flight():
            start = time.perf_counter()
            with conn.cursor() as cur:
                cur.execute(FLIGHT_SQL)
                rows = sum(b.num_rows for b in cur.fetch_record_batch())
            return time.perf_counter() - start, rows

        idle = rss_kib(server.pid, "VmRSS")
        t_flight, t_local = [], []
        for r in range(args.runs):
            for which in (["flight", "local"] if r % 2 == 0 else ["local", "flight"]):
                if which == "flight":
                    s, n = over_flight()
                    t_flight.append(s)
                else:
                    s, n = local.run_sql(FLIGHT_SQL)
                    t_local.append(s)
                if n != args.rows:
                    raise SystemExit(f"{which}: {n} rows, expected {args.rows}")
        peak = rss_kib(server.pid, "VmHWM")
        local.close()
        conn.close()
    finally:
        server.terminate()
        server.wait()
    f, l = statistics.median(t_flight), statistics.median(t_local)
    return ["", f"Flight SQL streaming: `{FLIGHT_SQL}` ({args.rows:,} rows, 7 columns) as `admin`, median of {args.runs}:",
            "", "| in-process (drained) | Flight SQL → Python ADBC (record batches iterated) | Flight / in-process | server RSS idle → peak |",
            "|---|---|---|---|",
            f"| {l:.3f} s | {f:.3f} s | **{f / l:.2f}×** | {idle / 1024:.0f} → {peak / 1024:.0f} MiB |"]


def rss_kib(pid, field):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        python_worker(sys.argv[2], sys.argv[3])
    else:
        main()
