#!/usr/bin/env python3
"""Scale-out overhead: the same queries on one process and on a coordinator with 1 and 3
`clearice worker` processes on loopback, over the comparison harness's encrypted
Iceberg table (PyArrow PME, 5M rows by default; one file, split into byte ranges).

    target/clearice-test-cache/venv/bin/python benches/compare/cluster.py [--rows 5000000] [--runs 7] [--results]

Every configuration runs in one long-lived runner (`compare clearice`, with
`--distributed` for a coordinator); rounds alternate the order, the median is reported.
Results are checked equal to the single process's before any time is reported. The
`probe` query touches one row group: its time is what a distributed query costs beyond
the work (planning, signing and shipping the stage, the worker planning the scan again,
the stream back). The coordinator's KMS unwraps are reported: it reads no data.
"""

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run  # noqa: E402  (the harness: dataset, runners, result checks)

QUERIES = {
    "W2": ("GROUP BY currency, sum(amount) (encrypted)",
           "SELECT currency, sum(amount) AS amount, count(*) AS n FROM lake.bench.payments GROUP BY currency"),
    "W1": ("decode every column, small result", run.WORKLOADS["W1"][1].format(p="lake.bench.payments")),
    "probe": ("one row group: the fixed cost of a query",
              "SELECT sum(amount) AS amount, count(*) AS n FROM lake.bench.payments WHERE payment_id < 1000"),
}


def start_worker(clearice, config, addr_file):
    if addr_file.exists():
        addr_file.unlink()
    proc = subprocess.Popen([clearice, "--config", str(config), "worker", "--addr", "127.0.0.1:0",
                             "--addr-file", str(addr_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while not addr_file.exists() or not addr_file.read_text().strip():
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit(f"worker did not start ({config})")
        time.sleep(0.05)
    return proc, addr_file.read_text().strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--bin-dir", type=Path, default=None, help="skip the build; binaries here")
    ap.add_argument("--results", action="store_true", help="write the table into benches/RESULTS.md")
    args = ap.parse_args()
    target = Path(os.environ.get("CARGO_TARGET_DIR", run.ROOT / "target"))
    if args.bin_dir is None:
        run.log("building release binaries")
        subprocess.run(["cargo", "build", "--release", "-p", "clearice-cli", "-p", "clearice-benches",
                        "--bin", "clearice", "--bin", "compare"], cwd=run.ROOT, check=True)
        args.bin_dir = target / "release"
    work = target / "compare" / str(args.rows)
    if not (work / "rows").exists() or (work / "rows").read_text() != str(args.rows):
        run.generate(work, args.rows)
    compare, clearice = str(args.bin_dir / "compare"), str(args.bin_dir / "clearice")
    base = (work / "clearice.toml").read_text()
    (work / "cluster.secret").write_text(os.urandom(32).hex())
    cluster = '\n[cluster]\nsecret_file = "cluster.secret"\n'
    (work / "cluster-worker.toml").write_text(base + cluster)
    procs, addrs = [], []
    try:
        for i in range(3):
            p, a = start_worker(clearice, work / "cluster-worker.toml", work / f"worker{i}.addr")
            procs.append(p)
            addrs.append(a)
        runners = [run.Worker("1 process", [compare, "clearice", "--config", str(work / "clearice.toml")], {})]
        for n in (1, 3):
            urls = ", ".join(f'"http://{a}"' for a in addrs[:n])
            path = work / f"cluster-{n}.toml"
            path.write_text(base + cluster + f"workers = [{urls}]\n")
            runners.append(run.Worker(f"{n} worker{'s' if n > 1 else ''}",
                                      [compare, "clearice", "--config", str(path), "--distributed"], {}))
        time.sleep(1.0)  # the coordinators' first worker probe
        run.log("checking results against the single process")
        for q, (_, sql) in QUERIES.items():
            runners[0].ask(f"DUMP\t{work / 'want.arrow'}\t{sql}")
            import pyarrow.ipc as ipc
            with ipc.open_file(work / "want.arrow") as f:
                want = f.read_all()
            for r in runners[1:]:
                r.ask(f"DUMP\t{work / 'got.arrow'}\t{sql}")
                with ipc.open_file(work / "got.arrow") as f:
                    run.check(r.name, q, f.read_all(), want)
        times = {(r.name, q): [] for r in runners for q in QUERIES}
        for i in range(args.runs):
            order = runners[i % len(runners):] + runners[:i % len(runners)]
            for q, (_, sql) in QUERIES.items():
                for r in order:
                    times[(r.name, q)].append(r.run_sql(sql)[0])
            run.log(f"round {i + 1}/{args.runs} done")
        kms = {r.name: r.kms() for r in runners}
        for r in runners:
            r.close()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    lines = [
        f"Scale-out, {args.rows:,} rows (one {os.path.getsize(work / 'data' / 'enc.parquet') / 1e6:.0f} MB "
        f"PME file, 20 row groups), median of {args.runs} warm rounds; {os.cpu_count()} vCPU {cpu}; "
        f"coordinator, workers and runner share the machine. "
        f"`benches/compare/cluster.py --rows {args.rows} --runs {args.runs}`",
        "",
        "| query | 1 process | 1 worker | 3 workers | 1 worker / 1 process | 3 workers / 1 process |",
        "|---|---|---|---|---|---|",
    ]
    for q, (what, _) in QUERIES.items():
        one, w1, w3 = med[("1 process", q)], med[("1 worker", q)], med[("3 workers", q)]
        lines.append(f"| {q}: {what} | {one * 1000:.0f} ms | {w1 * 1000:.0f} ms | {w3 * 1000:.0f} ms | "
                     f"{w1 / one:.2f} | {w3 / one:.2f} |")
    lines += ["", "KMS unwraps by the runner's process (coordinators read no data): " +
              ", ".join(f"{k} {v}" for k, v in kms.items())]
    print("\n".join(lines))
    if args.results:
        run.write_results(lines, "cluster", heading="Scale-out (coordinator and workers)")


if __name__ == "__main__":
    main()
