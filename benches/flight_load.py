"""Load test for `clearice serve`: N concurrent ADBC Flight SQL clients for a bounded time,
mixing point queries, large scans and denied queries.

    python benches/flight_load.py --config DIR/clearice.toml [--clients 32] [--seconds 30]

Starts the server itself (target/release/clearice, or --bin), reports queries/s, p50/p99
latency per kind, unexpected errors (must be 0), the server's peak RSS, the latency of a point
query from a single client on an otherwise idle server, and the streaming
throughput of a large scan over Flight vs the same scan in-process (`clearice -c`).
"""
import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import adbc_driver_flightsql.dbapi as flightsql

QUERIES = {
    "point": ("analyst", "SELECT id, ssn, email FROM lake.sales.customers WHERE id = {id}"),
    "scan": ("admin", "SELECT * FROM lake.sales.orders"),
    "agg": ("analyst", "SELECT country, count(*), sum(balance) FROM lake.sales.customers GROUP BY country"),
    "denied": ("analyst", "SELECT card_number FROM lake.sales.orders LIMIT 1"),
}
MIX = ["point"] * 6 + ["agg"] * 2 + ["scan"] + ["denied"]


def peak_rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return -1


def client(addr, deadline, results, errors, lock):
    conns = {
        u: flightsql.connect(f"grpc://{addr}", db_kwargs={"username": u, "password": u}) for u in ("admin", "analyst")
    }
    rng = random.Random()
    while time.monotonic() < deadline:
        kind = rng.choice(MIX)
        user, sql = QUERIES[kind]
        cur = conns[user].cursor()
        t0 = time.perf_counter()
        try:
            cur.execute(sql.format(id=1_000_000 + rng.randrange(100_000)))
            cur.fetch_arrow_table()
            ok = kind != "denied"
        except Exception as e:  # noqa: BLE001
            ok = kind == "denied" and "card_number" in str(e)
            if not ok:
                with lock:
                    errors.append(f"{kind}: {e}")
        dt = time.perf_counter() - t0
        cur.close()
        with lock:
            results.setdefault(kind, []).append(dt)
        if not ok and kind != "denied":
            continue
    for c in conns.values():
        c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--bin", default="target/release/clearice")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=30)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    addr_file = Path(tmp) / "addr"
    server = subprocess.Popen(
        [a.bin, "--config", a.config, "serve", "--addr", "127.0.0.1:0", "--addr-file", str(addr_file)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not addr_file.exists() or not addr_file.read_text():
            time.sleep(0.1)
        addr = addr_file.read_text()
        results, errors, lock = {}, [], threading.Lock()
        deadline = time.monotonic() + a.seconds
        threads = [
            threading.Thread(target=client, args=(addr, deadline, results, errors, lock)) for _ in range(a.clients)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        total = sum(len(v) for v in results.values())
        print(f"clients={a.clients} seconds={wall:.1f} queries={total} qps={total / wall:.1f}")
        for kind, v in sorted(results.items()):
            v.sort()
            p99 = v[min(len(v) - 1, int(len(v) * 0.99))]
            print(f"  {kind:7s} n={len(v):6d} p50={statistics.median(v) * 1000:8.1f} ms  p99={p99 * 1000:8.1f} ms")
        print(f"unexpected errors: {len(errors)}")
        for e in errors[:5]:
            print("   ", e)
        print(f"server peak RSS: {peak_rss_kib(server.pid) / 1024:.0f} MiB")
        # unloaded latency: one client, point queries back to back (GetFlightInfo + DoGet)
        conn = flightsql.connect(f"grpc://{addr}", db_kwargs={"username": "analyst", "password": "analyst"})
        cur = conn.cursor()
        lat = []
        for _ in range(50):
            sql = QUERIES["point"][1].format(id=random.randint(1_000_000, 1_049_999))
            lat.append(timed(lambda: (cur.execute(sql), cur.fetchall())))
        cur.close()
        conn.close()
        print(f"unloaded point query (1 client): p50={statistics.median(lat[5:]) * 1000:.1f} ms")
        # streaming throughput: one large scan over Flight vs in-process
        conn = flightsql.connect(f"grpc://{addr}", db_kwargs={"username": "admin", "password": "admin"})
        cur = conn.cursor()
        best_flight = min(timed(lambda: (cur.execute(QUERIES["scan"][1]), cur.fetch_arrow_table())) for _ in range(3))
        conn.close()
        best_local = min(local_scan(a) for _ in range(3))
        print(f"large scan (200k rows): flight {best_flight:.3f} s, in-process {best_local:.3f} s, "
              f"ratio {best_flight / best_local:.2f}")
        return 1 if errors else 0
    finally:
        server.terminate()
        server.wait()


def timed(f):
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def local_scan(a):
    out = subprocess.run(
        [a.bin, "--config", a.config, "--user", "admin", "--format", "csv", "-c",
         "SELECT count(order_id), count(customer_id), max(order_date), sum(amount), max(card_number), max(status) "
         "FROM lake.sales.orders"],
        capture_output=True, text=True, check=True,
    )
    # the CLI prints "N rows in X s" for the query itself (no process start-up). The query
    # decodes every column of the scan but does not materialize rows for a client, so the
    # ratio is an upper bound on Flight's overhead (serialization + transport + client decode).
    line = [l for l in out.stderr.splitlines() if " in " in l][-1]
    return float(line.rsplit(" ", 1)[1].rstrip("s"))


if __name__ == "__main__":
    sys.exit(main())
