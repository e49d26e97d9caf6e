"""A REST catalog that returns read restrictions, for the Rust test `rest`
(crates/engine/tests/it/rest.rs). Iceberg's Java RESTCatalogServer does not serve
`read-restrictions` yet, so this server stands in front of it: every request goes to the
real catalog, and each `loadTable` answer (GET /v1/{prefix}/namespaces/{ns}/tables/{t})
gets the `read-restrictions` object of the Iceberg REST OpenAPI spec
(`LoadTableResult.read-restrictions`: `required-column-projections`, `required-row-filter`)
that its configuration gives the principal the bearer token authenticates. A request
without a known token is refused (401, the spec's error model), as a catalog that
authenticates principals would.

usage:
  rest_restrictions.py serve PORT UPSTREAM CONFIG_JSON
      CONFIG_JSON: {"tokens": {TOKEN: PRINCIPAL}, "restrictions": {PRINCIPAL: {"ns.table": OBJ}}}
      Prints nothing; serves until killed.
  rest_restrictions.py expect INTEROP_DIR
      The test's expected answers, computed from the interop lake's plaintext twin
      (plain.parquet) with pyarrow and the spec's rules written out here, independently
      of ClearIce.
  rest_restrictions.py duckdb INTEROP_DIR QUERIES_JSON
      Runs each query (a JSON list; `{T}` names the table) in DuckDB over a view of the
      plaintext twin that applies the analyst's restrictions as the spec defines them (the
      row filter, then mask-alphanum, sha-256-global on top of the policy's show_last_4
      (NULL), mask-to-default, truncate-to-year; email hidden). Prints a list of
      {"rows": [...]} or {"error": "..."}.
"""
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOAD_TABLE = re.compile(r"^/v1/(?:[^/]+/)?namespaces/([^/]+)/tables/([^/]+)$")


def serve(port, upstream, config_path):
    with open(config_path) as f:
        config = json.load(f)
    tokens = config["tokens"]
    restrictions = config["restrictions"]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def refuse(self, code, message):
            body = json.dumps({"error": {"message": message, "type": "NotAuthorizedException", "code": code}}).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def forward(self):
            path = urllib.parse.urlsplit(self.path).path
            auth = self.headers.get("Authorization", "")
            principal = tokens.get(auth[len("Bearer "):]) if auth.startswith("Bearer ") else None
            if principal is None and path not in ("/v1/oauth/tokens", "/v1/config"):
                return self.refuse(401, "unknown or missing bearer token")
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length", "connection")}
            req = urllib.request.Request(upstream + self.path, data=body, headers=headers, method=self.command)
            try:
                with urllib.request.urlopen(req) as r:
                    status, answer, ctype = r.status, r.read(), r.headers.get("Content-Type", "application/json")
            except urllib.error.HTTPError as e:
                status, answer, ctype = e.code, e.read(), e.headers.get("Content-Type", "application/json")
            m = LOAD_TABLE.match(path)
            if self.command == "GET" and m and status == 200:
                ns = ".".join(urllib.parse.unquote(m.group(1)).split("\x1f"))
                table = f"{ns}.{urllib.parse.unquote(m.group(2))}"
                r = restrictions.get(principal, {}).get(table)
                if r is not None:
                    loaded = json.loads(answer)
                    loaded["read-restrictions"] = r
                    answer = json.dumps(loaded).encode()
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer)

        do_GET = do_POST = do_DELETE = do_HEAD = forward

    ThreadingHTTPServer(("127.0.0.1", int(port)), Handler).serve_forever()


def mask_alphanum(s):
    """The spec's mask-alphanum, code point by code point."""
    return "".join("n" if "0" <= c <= "9" else c if c in "(),.-@" else "x" for c in s)


def expect(interop):
    import pyarrow.parquet as pq
    rows = pq.read_table(f"{interop}/plain.parquet").to_pylist()
    # The analyst's required row filter: country in (DE, FR) and birth_date not null.
    kept = [r for r in rows if r["country"] in ("DE", "FR") and r["birth_date"] is not None]
    kept.sort(key=lambda r: r["id"])
    print(json.dumps({
        "count": len(kept),
        "all": len(rows),
        "names": [[r["id"], None if r["name"] is None else mask_alphanum(r["name"])] for r in kept],
        "balances": sum(r["balance"] is not None for r in kept),
        "years": [[r["id"], None if r["signup_ts"] is None else r["signup_ts"].year] for r in kept],
        "de": sum(r["country"] == "DE" for r in rows),
    }))


ANALYST_VIEW = """
CREATE VIEW customers AS
SELECT id,
       mask_alphanum(name) AS name,
       CAST(NULL AS VARCHAR) AS ssn,
       birth_date,
       CASE WHEN balance IS NULL THEN NULL ELSE CAST(0 AS DECIMAL(12, 2)) END AS balance,
       date_trunc('year', signup_ts) AS signup_ts,
       country,
       tags
FROM read_parquet('{plain}')
WHERE country IN ('DE', 'FR') AND birth_date IS NOT NULL
"""


def run_duckdb(interop, queries_path):
    import duckdb
    from duckdb.sqltypes import VARCHAR
    with open(queries_path) as f:
        queries = json.load(f)
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.create_function("mask_alphanum", mask_alphanum, [VARCHAR], VARCHAR)
    con.execute(ANALYST_VIEW.format(plain=f"{interop}/plain.parquet"))
    out = []
    for q in queries:
        try:
            rows = con.execute(q.replace("{T}", "customers")).fetchall()
            out.append({"rows": [[v if v is None or isinstance(v, (int, str)) else str(v) for v in r] for r in rows]})
        except duckdb.Error as e:
            out.append({"error": str(e).splitlines()[0]})
    print(json.dumps(out))


def main():
    cmd, *args = sys.argv[1:]
    {"serve": serve, "expect": expect, "duckdb": run_duckdb}[cmd](*args)


if __name__ == "__main__":
    main()
