"""Differential SQL writes: random UPDATE / DELETE / MERGE / INSERT statements (IN, NOT IN,
EXISTS, NOT EXISTS and scalar subqueries, NULLs, CASE, AND/OR/NOT) run against a real
`clearice serve` over ADBC (Flight SQL) and against DuckDB on the same rows. After every
statement the reported row count and the table's contents must be equal, or ClearIce
refused the statement in one line ("refused before any change") and left the table as it
was. Used by crates/cli/tests/it/writes.rs.

usage: differential_writes.py ADDR SEED[,SEED...] STATEMENTS_PER_SEED [FORMAT [FILTER]] -> prints JSON

FORMAT 3: ClearIce's tables are format 3 (its rewrites keep row lineage).
FILTER: the statements run as `support`, whose row filter on lake.diff.t is FILTER (the
server's policy says so); DuckDB computes what they must do from the same rows: DELETE and
UPDATE change only rows FILTER keeps (their subqueries over the table read those rows only),
an UPDATE setting a column FILTER reads is refused, an INSERT of a row FILTER does not keep
fails and changes nothing. No MERGE (refused under a row filter).
"""
import json
import random
import sys

import adbc_driver_flightsql.dbapi as flightsql
import adbc_driver_manager
import duckdb

T = "lake.diff.t"
TV = "lake.diff.tv"  # DuckDB: the rows of T the filter keeps
S = "lake.diff.s"
COLS = "id, a, b, c"


def connect(addr, user="admin"):
    return flightsql.connect(f"grpc://{addr}", db_kwargs={"username": user, "password": user})


class ClearIce:
    def __init__(self, conn):
        self.conn = conn

    def update(self, sql):
        cur = self.conn.cursor()
        stmt = cur.adbc_statement
        stmt.set_sql_query(sql)
        n = stmt.execute_update()
        cur.close()
        return n

    def rows(self, table):
        cur = self.conn.cursor()
        cur.execute(f"SELECT {COLS} FROM {table}")
        rows = sorted_rows(cur.fetchall())
        cur.close()
        return rows


class Duck:
    def __init__(self):
        self.db = duckdb.connect()
        self.db.execute("ATTACH ':memory:' AS lake")

    def update(self, sql):
        r = self.db.execute(sql).fetchall()
        return r[0][0] if r and len(r[0]) == 1 and isinstance(r[0][0], int) else -1

    def rows(self, table):
        return sorted_rows(self.db.execute(f"SELECT {COLS} FROM {table}").fetchall())


def norm(v):
    if isinstance(v, float):
        return round(v, 9)
    return v


def sorted_rows(rows):
    rows = [tuple(norm(v) for v in r) for r in rows]
    return sorted(rows, key=lambda r: tuple((v is None, "" if v is None else v) for v in r))


# ---- random statements -------------------------------------------------------------


class Gen:
    def __init__(self, rng):
        self.r = rng

    def num(self):
        return self.r.choice([-1, 0, 1, 2, 3, 5, 7, 10, 20, 50])

    def text(self):
        return self.r.choice(["'x'", "'y'", "'zz'", "'q'"])

    def atom(self, q="", depth=0):
        """A boolean condition over target columns (qualified with `q` if given)."""
        p = f"{q}." if q else ""
        r = self.r.random()
        if r < 0.12:
            return f"{p}a {self.r.choice(['<', '<=', '=', '<>', '>', '>='])} {self.num()}"
        if r < 0.2:
            return f"{p}id {self.r.choice(['<', '=', '>'])} {self.r.randint(0, 40)}"
        if r < 0.27:
            return f"{p}{self.r.choice(['a', 'b', 'c'])} IS {self.r.choice(['', 'NOT '])}NULL"
        if r < 0.33:
            return f"{p}b = {self.text()}"
        if r < 0.38:
            return f"{p}c > {self.r.choice([0.5, 1.5, 3.0, 10.0])}"
        if r < 0.43:
            return f"{p}a BETWEEN {self.num()} AND {self.num()}"
        if r < 0.48:
            vals = ", ".join(str(self.num()) for _ in range(self.r.randint(1, 4)))
            if self.r.random() < 0.3:
                vals += ", NULL"
            return f"{p}a {self.r.choice(['', 'NOT '])}IN ({vals})"
        if r < 0.53:
            return f"CASE WHEN {p}a > {self.num()} THEN {p}b = {self.text()} ELSE {p}id < {self.r.randint(0, 40)} END"
        if r < 0.58:
            return f"coalesce({p}a, {self.num()}) > {self.num()}"
        # subqueries (uncorrelated: ClearIce runs them; correlated: it refuses them)
        sub_where = self.s_cond()
        if r < 0.68:
            col = self.r.choice(["id", "a"])
            return f"{p}{col} {self.r.choice(['', 'NOT '])}IN (SELECT {self.r.choice(['id', 'a'])} FROM {S}{sub_where})"
        if r < 0.74:
            return f"{self.r.choice(['', 'NOT '])}EXISTS (SELECT 1 FROM {S}{sub_where})"
        if r < 0.8:
            agg = self.r.choice(["max(a)", "min(id)", "count(*)", "sum(a)"])
            return f"{p}a {self.r.choice(['<', '=', '>'])} (SELECT {agg} FROM {S}{sub_where})"
        if r < 0.84:
            # correlated: must be refused (or run exactly)
            tq = q or T
            return f"{self.r.choice(['', 'NOT '])}EXISTS (SELECT 1 FROM {S} WHERE {S}.id = {tq}.id)"
        if r < 0.88:
            return f"{p}id IN (SELECT id FROM {T} WHERE a {self.r.choice(['<', '>'])} {self.num()})"
        if depth < 2:
            return f"NOT ({self.cond(q, depth + 1)})"
        return f"{p}a > {self.num()}"

    def s_cond(self):
        r = self.r.random()
        if r < 0.35:
            return ""
        if r < 0.6:
            return f" WHERE a > {self.num()}"
        if r < 0.8:
            return f" WHERE id < {self.r.randint(0, 40)}"
        return " WHERE a IS NULL"

    def cond(self, q="", depth=0):
        c = self.atom(q, depth)
        for _ in range(self.r.choice([0, 0, 1, 1, 2])):
            c = f"({c}) {self.r.choice(['AND', 'OR'])} ({self.atom(q, depth)})"
        return c

    def value(self, col, q=""):
        p = f"{q}." if q else ""
        if col == "a":
            return self.r.choice([
                f"{p}a + {self.num()}", str(self.num()), "NULL", f"{p}a * 2",
                f"CASE WHEN {p}a > {self.num()} THEN NULL ELSE {p}a END",
                f"(SELECT max(a) FROM {S})", f"coalesce({p}a, 0) - 1",
            ])
        if col == "b":
            return self.r.choice([self.text(), "NULL", f"upper({p}b)", f"{p}b || 'x'",
                                  f"CASE WHEN {p}b IS NULL THEN 'n' ELSE {p}b END"])
        return self.r.choice([f"{p}c * 2", "1.5", "NULL", f"{p}c + 0.25"])

    def where(self):
        return "" if self.r.random() < 0.08 else f" WHERE {self.cond()}"

    def statement(self, merge=True):
        k = self.r.random() * (0.82 if not merge else 1.0)
        if k < 0.33:
            return f"DELETE FROM {T}{self.where()}"
        if k < 0.66:
            cols = self.r.sample(["a", "b", "c"], self.r.randint(1, 3))
            sets = ", ".join(f"{c} = {self.value(c)}" for c in cols)
            return f"UPDATE {T} SET {sets}{self.where()}"
        if k < 0.82:
            if self.r.random() < 0.5:
                rows = ", ".join(
                    f"({self.r.randint(0, 40)}, {self.r.choice([str(self.num()), 'NULL'])}, "
                    f"{self.r.choice([self.text(), 'NULL'])}, {self.r.choice(['1.5', '2.25', 'NULL'])})"
                    for _ in range(self.r.randint(1, 3))
                )
                return f"INSERT INTO {T} VALUES {rows}"
            return f"INSERT INTO {T} SELECT id + 100, a, b, c FROM {T} WHERE {self.cond()}"
        # MERGE with a source keyed by id (at most one source row per target row)
        src = f"(SELECT id, max(a) AS a FROM {S} WHERE id IS NOT NULL GROUP BY id)"
        clauses = []
        if self.r.random() < 0.7:
            cond = f" AND {self.cond('t')}" if self.r.random() < 0.5 else ""
            if self.r.random() < 0.6:
                clauses.append(f"WHEN MATCHED{cond} THEN UPDATE SET a = {self.r.choice(['src.a', 't.a + src.a', 'NULL', '0'])}")
            else:
                clauses.append(f"WHEN MATCHED{cond} THEN DELETE")
        if self.r.random() < 0.6 or not clauses:
            clauses.append("WHEN NOT MATCHED THEN INSERT (id, a, b, c) VALUES (src.id, src.a, 'm', 0.5)")
        return f"MERGE INTO {T} AS t USING {src} AS src ON t.id = src.id " + " ".join(clauses)


# ---- setup and the run -------------------------------------------------------------


def setup(rng):
    rows_t = []
    for i in range(1, 31):
        rows_t.append((i, rng.choice([None, 0, 1, 2, 3, 5, 7, 10, 20, -1]),
                       rng.choice([None, "x", "y", "zz"]), rng.choice([None, 0.5, 1.5, 3.0, 10.0])))
    rows_s = [(i, rng.choice([None, 1, 2, 5, 7, 20])) for i in rng.sample(range(0, 45), 12)]
    rows_s.append((None, 3))
    return rows_t, rows_s


def lit(v):
    if v is None:
        return "NULL"
    if isinstance(v, str):
        return f"'{v}'"
    return repr(v)


def values(rows):
    return ", ".join("(" + ", ".join(lit(v) for v in r) + ")" for r in rows)


def create(ci, rng, fmt):
    """The seed's tables T and S in ClearIce (format `fmt`) and in a new DuckDB."""
    duck = Duck()
    rows_t, rows_s = setup(rng)
    ci.update("DROP SCHEMA IF EXISTS lake.diff CASCADE")
    ci.update("CREATE SCHEMA lake.diff")
    duck.update("CREATE SCHEMA lake.diff")
    for eng in (ci, duck):
        with_ = f" WITH (\"format-version\" = '{fmt}')" if eng is ci and fmt != "2" else ""
        eng.update(f"CREATE TABLE {T} (id BIGINT, a BIGINT, b VARCHAR, c DOUBLE){with_}")
        eng.update(f"CREATE TABLE {S} (id BIGINT, a BIGINT, b VARCHAR, c DOUBLE){with_}")
        eng.update(f"INSERT INTO {T} VALUES {values(rows_t)}")
        eng.update(f"INSERT INTO {S} (id, a) VALUES {values(rows_s)}")
    return duck


def filter_columns(flt):
    return {c for c in ("id", "a", "b", "c") if c in flt.replace("(", " ").replace(")", " ").split()}


def under_filter(sql, flt, duck):
    """What the statement must do under the row filter: ("refuse", why), ("fail", why) or
    ("run", DuckDB's statement)."""
    kind = sql.split()[0]
    sub = sql.replace(f"(SELECT id FROM {T} ", f"(SELECT id FROM {TV} ")
    if kind == "DELETE":
        head, _, where = sub.partition(" WHERE ")
        return ("run", f"{head} WHERE ({flt}) AND ({where})" if where else f"{head} WHERE {flt}")
    if kind == "UPDATE":
        sets = sub.split(" SET ", 1)[1].split(" WHERE ")[0]
        set_cols = {a.split("=")[0].strip() for a in sets.split(", ") if "=" in a}
        if set_cols & filter_columns(flt):
            return ("refuse", "sets a column the filter reads")
        head, _, where = sub.partition(" WHERE ")
        return ("run", f"{head} WHERE ({flt}) AND ({where})" if where else f"{head} WHERE {flt}")
    # INSERT: every row written must pass the filter.
    if " VALUES " in sub:
        rows = f"SELECT * FROM (VALUES {sub.split(' VALUES ', 1)[1]}) v(id, a, b, c)"
    else:
        sub = sub.replace(f"c FROM {T} WHERE", f"c FROM {TV} WHERE")
        rows = "SELECT * FROM (" + sub.split(f"INSERT INTO {T} ", 1)[1] + ") v(id, a, b, c)"
    bad = duck.db.execute(f"SELECT count(*) FROM ({rows}) r WHERE NOT coalesce({flt}, false)").fetchall()[0][0]
    if bad:
        return ("fail", "a row outside the filter")
    return ("run", sub)


def run_filtered(ci, writer, seed, n, out, flt):
    rng = random.Random(seed)
    duck = create(ci, rng, "2")
    duck.db.execute(f"CREATE VIEW {TV} AS SELECT * FROM {T} WHERE {flt}")
    gen = Gen(rng)
    for _ in range(n):
        sql = gen.statement(merge=False)
        kind = sql.split()[0]
        out["statements"] += 1
        before = ci.rows(T)
        try:
            expect, what = under_filter(sql, flt, duck)
        except duckdb.Error:
            out["both_failed"] += 1  # DuckDB cannot even evaluate the rows (a bad subquery)
            continue
        try:
            got, ci_err = writer.update(sql), None
        except adbc_driver_manager.Error as e:
            got, ci_err = None, str(e)
        after = ci.rows(T)
        if ci_err is not None:
            if after != before:
                out["mismatches"].append({"seed": seed, "sql": sql, "why": "failed, but the table changed"})
                return
            if expect == "refuse" and "refused before any change" in ci_err:
                out["refused"][kind] = out["refused"].get(kind, 0) + 1
                continue
            if expect == "fail" and "its row filter does not show" in ci_err:
                out["refused"]["INSERT outside the filter"] = out["refused"].get("INSERT outside the filter", 0) + 1
                continue
            if expect == "run" and "refused before any change" in ci_err:
                out["refused"][kind] = out["refused"].get(kind, 0) + 1
                continue
            if expect == "run":
                try:
                    duck.update(what)
                except duckdb.Error:
                    out["both_failed"] += 1
                    continue
                out["mismatches"].append({"seed": seed, "sql": sql, "why": f"ClearIce failed: {ci_err.splitlines()[0][:300]}"})
                return
            out["mismatches"].append({"seed": seed, "sql": sql, "why": f"expected {expect} ({what}), got: {ci_err.splitlines()[0][:300]}"})
            return
        if expect != "run":
            out["mismatches"].append({"seed": seed, "sql": sql, "why": f"expected {expect} ({what}), ClearIce ran it ({got})"})
            return
        try:
            want = duck.update(what)
        except duckdb.Error as e:
            out["mismatches"].append({"seed": seed, "sql": sql, "why": f"DuckDB failed ({e}), ClearIce reported {got}"})
            return
        out["executed"][kind] = out["executed"].get(kind, 0) + 1
        expect_rows = duck.rows(T)
        if got != want or after != expect_rows:
            out["mismatches"].append({
                "seed": seed, "sql": sql, "duckdb_sql": what, "clearice_count": got, "duckdb_count": want,
                "clearice_rows": after[:40], "duckdb_rows": expect_rows[:40],
            })
            return
        if len(after) > 120:
            for eng in (ci, duck):
                eng.update(f"DELETE FROM {T} WHERE id >= 100")


def run_seed(ci, seed, n, out, fmt="2"):
    rng = random.Random(seed)
    duck = create(ci, rng, fmt)
    gen = Gen(rng)
    for _ in range(n):
        sql = gen.statement()
        before = ci.rows(T)
        out["statements"] += 1
        kind = sql.split()[0]
        try:
            want = duck.update(sql)
            duck_err = None
        except duckdb.Error as e:
            want, duck_err = None, str(e).splitlines()[0]
        try:
            got = ci.update(sql)
            ci_err = None
        except adbc_driver_manager.Error as e:
            got, ci_err = None, str(e)
        after = ci.rows(T)
        if ci_err is not None:
            if "refused before any change" in ci_err:
                out["refused"][kind] = out["refused"].get(kind, 0) + 1
                if after != before:
                    out["mismatches"].append({"seed": seed, "sql": sql, "why": "refused, but the table changed"})
                if duck_err is None:
                    # DuckDB applied it: bring its table back to ClearIce's rows.
                    duck.db.execute(f"DELETE FROM {T}")
                    if after:
                        duck.db.execute(f"INSERT INTO {T} VALUES {values(after)}")
                continue
            if duck_err is not None:
                # Both refuse (e.g. a scalar subquery with more than one row, a MERGE
                # target row matched twice); ClearIce must leave the table as it was.
                out["both_failed"] += 1
                if after != before:
                    out["mismatches"].append({"seed": seed, "sql": sql, "why": "failed, but the table changed"})
                continue
            out["mismatches"].append({"seed": seed, "sql": sql, "why": f"ClearIce failed: {ci_err.splitlines()[0][:300]}"})
            return
        if duck_err is not None:
            out["mismatches"].append({"seed": seed, "sql": sql, "why": f"DuckDB failed ({duck_err}), ClearIce reported {got}"})
            return
        out["executed"][kind] = out["executed"].get(kind, 0) + 1
        expect = duck.rows(T)
        if got != want or after != expect:
            out["mismatches"].append({
                "seed": seed, "sql": sql, "clearice_count": got, "duckdb_count": want,
                "clearice_rows": after[:40], "duckdb_rows": expect[:40],
            })
            return
        # Keep the table small: the next statements stay fast.
        if len(after) > 120:
            for eng in (ci, duck):
                eng.update(f"DELETE FROM {T} WHERE id >= 100")


def main():
    addr, seeds, n = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], int(sys.argv[3])
    fmt = sys.argv[4] if len(sys.argv) > 4 else "2"
    flt = sys.argv[5] if len(sys.argv) > 5 else None
    out = {"statements": 0, "executed": {}, "refused": {}, "both_failed": 0, "mismatches": []}
    with connect(addr) as conn:
        ci = ClearIce(conn)
        if flt is not None:
            with connect(addr, "support") as w:
                for seed in seeds:
                    run_filtered(ci, ClearIce(w), seed, n, out, flt)
        else:
            for seed in seeds:
                run_seed(ci, seed, n, out, fmt)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
