"""CSV export of a multi-million-row Parquet file: `clearice -c ... --format csv > out.csv`
against DuckDB's `COPY ... TO 'out.csv'`, in one run, alternating, median of N.

usage: python benches/csv_export.py CLEARICE_BINARY CLEARICE_CONFIG [ROWS] [RUNS]
  (the venv of scripts/test.sh has pyarrow and duckdb)

Prints one JSON object: rows, file size, per tool the median wall time and peak RSS, and
the ratio clearice / duckdb. Results go to benches/RESULTS.md with the machine and command.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

def make_file(path, rows):
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(42)
    ids = np.arange(rows, dtype=np.int64)
    table = pa.table(
        {
            "payment_id": ids,
            "account": pa.array([f"ACC{i % 100000:07d}" for i in range(rows)]),
            "amount": pa.array(rng.integers(1, 10_000_000, rows) / 100.0),
            "currency": pa.array(rng.choice(["EUR", "USD", "GBP", "CHF", "JPY"], rows)),
            "paid_on": pa.array(
                (np.datetime64("2024-01-01") + rng.integers(0, 730, rows)).astype("datetime64[D]")
            ),
            "card_number": pa.array([f"4{i:015d}" for i in range(rows)]),
        }
    )
    pq.write_table(table, path, row_group_size=max(rows // 20, 1), compression="snappy")


def run_clearice(binary, config, src, out):
    start = time.time()
    with open(out, "wb") as f:
        p = subprocess.Popen(
            [binary, "--config", config, "--user", "admin", "--quiet", "--format", "csv",
             "-c", f"SELECT * FROM '{src}'"],
            stdout=f,
        )
        _, status, usage = os.wait4(p.pid, 0)
    assert status == 0, status
    return time.time() - start, usage.ru_maxrss / 1024


def run_duckdb(src, out):
    # In a child process too, so its peak RSS is its own.
    code = (
        "import duckdb,sys; duckdb.sql(f\"COPY (SELECT * FROM read_parquet('{sys.argv[1]}')) "
        "TO '{sys.argv[2]}' (HEADER, DELIMITER ',')\")"
    )
    start = time.time()
    p = subprocess.Popen([sys.executable, "-c", code, src, out])
    _, status, usage = os.wait4(p.pid, 0)
    assert status == 0, status
    return time.time() - start, usage.ru_maxrss / 1024


def main():
    binary, config = sys.argv[1], sys.argv[2]
    rows = int(sys.argv[3]) if len(sys.argv) > 3 else 5_000_000
    runs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "payments.parquet")
        # In a child: a forked child's peak RSS counts its parent's memory before exec, so
        # the parent stays small (no pyarrow or duckdb imported here).
        subprocess.run([sys.executable, __file__, "--make", src, str(rows)], check=True)
        results = {"clearice": [], "duckdb": []}
        for _ in range(runs):
            results["clearice"].append(run_clearice(binary, config, src, os.path.join(tmp, "c.csv")))
            results["duckdb"].append(run_duckdb(src, os.path.join(tmp, "d.csv")))
        out = {
            "rows": rows,
            "parquet_mb": round(os.path.getsize(src) / 2**20, 1),
            "csv_mb": round(os.path.getsize(os.path.join(tmp, "c.csv")) / 2**20, 1),
            "duckdb_version": subprocess.run(
                [sys.executable, "-c", "import duckdb; print(duckdb.__version__)"],
                capture_output=True, text=True, check=True,
            ).stdout.strip(),
        }
        for tool, rs in results.items():
            out[tool] = {
                "median_s": round(statistics.median(r[0] for r in rs), 2),
                "peak_rss_mib": round(max(r[1] for r in rs)),
            }
        out["ratio_clearice_over_duckdb"] = round(
            out["clearice"]["median_s"] / out["duckdb"]["median_s"], 2
        )
        print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "--make":
        make_file(sys.argv[2], int(sys.argv[3]))
    else:
        main()
