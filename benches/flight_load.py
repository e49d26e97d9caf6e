"""Load test for `clearice serve`: N concurrent ADBC Flight SQL clients for a bounded time,
mixing point queries, large scans and denied queries.

    python benches/flight_load.py --config DIR/clearice.toml [--clients 32] [--seconds 30]
                                  [--killed 0.1] [--basic-client]

Starts the server itself (target/release/clearice, or --bin), reports queries/s, p50/p99
latency per kind, unexpected errors (must be 0), statements the per-principal concurrency
limit refused (`[server.limits] max_concurrent_statements`: 29 clients of one principal pass
the default 16), the server's RSS (idle before, peak, and
idle again after the load), the latency of a point query from a single client on an
otherwise idle server, and the streaming throughput of a large scan over Flight vs the same
scan in-process (`clearice -c`).

`--killed F`: that share of the clients are separate processes that start large scans and
are SIGKILLed mid-stream, again and again (the server must clean up after them).
`--basic-client`: one more client sends `authorization: Basic ...` on every call instead of
logging in once (pyarrow.flight with raw Flight SQL commands), as some BI tools do.
"""
import argparse
import base64
import os
import random
import signal
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


def rss_kib(pid, field="VmHWM"):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return -1


def peak_rss_kib(pid):
    return rss_kib(pid, "VmHWM")


KILLED_CLIENT = """
import sys, adbc_driver_flightsql.dbapi as f
c = f.connect(sys.argv[1], db_kwargs={"username": "admin", "password": "admin"})
cur = c.cursor()
while True:
    cur.execute("SELECT * FROM lake.sales.orders a, (SELECT 1 UNION ALL SELECT 2) b")
    r = cur.fetch_record_batch()
    next(iter(r))  # the first batch arrives; the process is killed while the rest streams
    print("streaming", flush=True)
    r.read_all()
"""


def killed_clients(addr, deadline, n, stats, lock):
    """Processes that start scans and are SIGKILLed mid-stream, restarted until the deadline."""
    rng = random.Random(7)
    while time.monotonic() < deadline:
        procs = [
            subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, f"grpc://{addr}"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            for _ in range(n)
        ]
        for p in procs:
            p.stdout.readline()  # streaming (or EOF if it failed)
        time.sleep(rng.uniform(0.05, 0.5))
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        with lock:
            stats["killed"] = stats.get("killed", 0) + len(procs)


def any_command(type_name, payload):
    """A Flight SQL command wrapped in google.protobuf.Any (hand-encoded protobuf)."""
    def field(num, data):
        out, n = bytearray([(num << 3) | 2]), len(data)
        while True:
            b = n & 0x7F
            n >>= 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out) + data
    url = f"type.googleapis.com/arrow.flight.protocol.sql.{type_name}".encode()
    return field(1, url) + field(2, payload)


LIMITED_BY = "too many statements running for principal"
LIMITED = {}  # kind -> statements refused by the per-principal concurrency limit


def limited(kind, error, lock):
    """Counts `error` if the per-principal concurrency limit (`[server.limits]
    max_concurrent_statements`, 16 by default) answered it; such refusals are kept out of
    the errors, latencies and queries/s."""
    if LIMITED_BY not in str(error):
        return False
    with lock:
        LIMITED[kind] = LIMITED.get(kind, 0) + 1
    return True


def basic_client(addr, deadline, results, errors, lock):
    """Sends Basic credentials on every call (no handshake, no token)."""
    import pyarrow.flight as fl
    client = fl.FlightClient(f"grpc://{addr}")
    auth = b"Basic " + base64.b64encode(b"analyst:analyst")
    opts = fl.FlightCallOptions(headers=[(b"authorization", auth)])
    rng = random.Random(3)
    while time.monotonic() < deadline:
        sql = QUERIES["point"][1].format(id=1_000_000 + rng.randrange(100_000))
        cmd = any_command("CommandStatementQuery", bytes([0x0A]) + _varint(len(sql.encode())) + sql.encode())
        t0 = time.perf_counter()
        try:
            info = client.get_flight_info(fl.FlightDescriptor.for_command(cmd), opts)
            for ep in info.endpoints:
                client.do_get(ep.ticket, opts).read_all()
        except Exception as e:  # noqa: BLE001
            if not limited("basic", e, lock):
                with lock:
                    errors.append(f"basic: {e}")
            continue
        with lock:
            results.setdefault("basic", []).append(time.perf_counter() - t0)


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


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
            if limited(kind, e, lock):
                cur.close()
                continue
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
    ap.add_argument("--killed", type=float, default=0.0, help="share of clients killed mid-stream")
    ap.add_argument("--basic-client", action="store_true", help="one client sends Basic on every call")
    ap.add_argument("--rounds", type=int, default=1, help="bursts, with idle RSS taken after each")
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
        # Warm up (catalog load, first logins), then take the idle RSS.
        warm = flightsql.connect(f"grpc://{addr}", db_kwargs={"username": "admin", "password": "admin"})
        wc = warm.cursor()
        for sql in ("SELECT count(*) FROM lake.sales.customers", QUERIES["scan"][1]):
            wc.execute(sql)
            wc.fetch_arrow_table()
        wc.close()
        warm.close()
        time.sleep(1)
        idle_before = rss_kib(server.pid, "VmRSS")
        n_killed = int(round(a.clients * a.killed))
        stats = {}
        after_rounds = []
        for rnd in range(a.rounds):
            if rnd:
                # Only the last round's figures are reported; earlier ones show whether
                # memory after a burst grows from round to round (a leak) or not.
                results.clear()
            deadline = time.monotonic() + a.seconds
            threads = [
                threading.Thread(target=client, args=(addr, deadline, results, errors, lock))
                for _ in range(a.clients - n_killed)
            ]
            if n_killed:
                threads.append(threading.Thread(target=killed_clients, args=(addr, deadline, n_killed, stats, lock)))
            if a.basic_client:
                threads.append(threading.Thread(target=basic_client, args=(addr, deadline, results, errors, lock)))
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if rnd + 1 < a.rounds:
                time.sleep(12)
                after_rounds.append(rss_kib(server.pid, "VmRSS"))
        wall = time.monotonic() - t0
        if server.poll() is not None:
            errors.append(f"the server exited with {server.returncode}")
        total = sum(len(v) for v in results.values())
        print(f"clients={a.clients} seconds={wall:.1f} queries={total} qps={total / wall:.1f}")
        for kind, v in sorted(results.items()):
            v.sort()
            p99 = v[min(len(v) - 1, int(len(v) * 0.99))]
            print(f"  {kind:7s} n={len(v):6d} p50={statistics.median(v) * 1000:8.1f} ms  p99={p99 * 1000:8.1f} ms")
        print(f"unexpected errors: {len(errors)}")
        for e in errors[:5]:
            print("   ", e)
        if LIMITED:
            print(f"refused by the per-principal limit (max_concurrent_statements): {sum(LIMITED.values())} "
                  f"({', '.join(f'{k} {n}' for k, n in sorted(LIMITED.items()))}; all rounds)")
        if n_killed:
            print(f"clients killed mid-stream: {stats.get('killed', 0)} ({n_killed} at a time)")
        time.sleep(12)  # the server gives freed memory back every 10 s when idle
        idle_after = rss_kib(server.pid, "VmRSS")
        time.sleep(20)
        idle_later = rss_kib(server.pid, "VmRSS")
        print(f"server RSS: idle before {idle_before / 1024:.0f} MiB, peak {peak_rss_kib(server.pid) / 1024:.0f} MiB, "
              f"idle 12 s after {idle_after / 1024:.0f} MiB, 32 s after {idle_later / 1024:.0f} MiB")
        if after_rounds:
            print("  idle after earlier rounds: " + ", ".join(f"{r / 1024:.0f} MiB" for r in after_rounds))
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
