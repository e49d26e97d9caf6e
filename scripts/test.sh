#!/usr/bin/env bash
# Runs every test: installs the pinned Python packages (PyArrow, PyIceberg, DuckDB, ADBC;
# Superset 6.1 with the repository's SQLAlchemy dialect in a second venv, dbt in a third)
# into virtualenvs, fetches the Flight SQL JDBC driver jars (DBeaver's driver; run with the
# machine's Java 17), generates the PyArrow/PyIceberg interop lake, then runs the Rust unit,
# integration, doc and sqllogictest suites with those fixtures required. A throwaway
# PostgreSQL server (from the machine's postgresql package, installed if missing) holds the
# PostgreSQL catalog tests and Superset's metadata; Prometheus, Chromium and ChromeDriver
# come from Debian's packages when missing.
# The S3 tests start moto_server (from the venv), the REST catalog tests Iceberg's Java
# RESTCatalogServer, the HMS tests Hive's standalone metastore (both resolved with Maven),
# each on a loopback port. pyspark 4.1 (local mode, Java 17) with Iceberg's Spark runtime
# writes the Spark lake (row-level deletes, time travel) with Spark's own answers, and tables
# Iceberg encrypts itself through its Hive catalog (Hive's metastore, a Java keyring KMS).
#
#   ./scripts/test.sh                 # everything
#   ./scripts/test.sh -p clearice-sqllogictest --test sqllogictests -- demo
#
# Environment: CARGO_TARGET_DIR (build cache), CLEARICE_CACHE (venv + fixtures,
# default: $CARGO_TARGET_DIR/.. or ./target), CLEARICE_SHARED (the shared interop dir,
# default ../shared next to the checkout, else /work/shared).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SHARED=${CLEARICE_SHARED:-}
if [ -z "$SHARED" ]; then
  for d in "$ROOT/../shared" /work/shared; do
    if [ -f "$d/interop/make_fixtures.py" ]; then SHARED=$(cd "$d" && pwd); break; fi
  done
fi
[ -n "$SHARED" ] || { echo "error: shared interop fixtures not found (set CLEARICE_SHARED)" >&2; exit 2; }

CACHE=${CLEARICE_CACHE:-${CARGO_TARGET_DIR:-$ROOT/target}/clearice-test-cache}
mkdir -p "$CACHE"
# venv DIR REQUIREMENTS WHAT: a virtualenv holding REQUIREMENTS, made again when they change.
venv() {
  if [ ! -f "$1/.installed" ] || ! cmp -s "$2" "$1/.installed"; then
    echo "== installing $3 into $1"
    python3 -m venv "$1"
    "$1/bin/pip" install --quiet --disable-pip-version-check -r "$2"
    cp "$2" "$1/.installed"
  fi
}
VENV=$CACHE/venv
venv "$VENV" "$ROOT/scripts/requirements-test.txt" "Python test packages"
# Superset 6.1 pins SQLAlchemy 1.4: a venv of its own, with the repository's dialect and
# engine spec installed on every run (part of the change under test).
SVENV=$CACHE/venv-superset
venv "$SVENV" "$ROOT/scripts/requirements-superset.txt" "Superset and its Flight SQL dialects"
"$SVENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$ROOT/integrations/clearice-sqlalchemy"
# dbt with the repository's adapter: the packages once, the adapter on every run (it is
# part of the change under test).
DVENV=$CACHE/venv-dbt
venv "$DVENV" "$ROOT/scripts/requirements-dbt.txt" "dbt-core"
"$DVENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall "$ROOT/integrations/dbt-clearice"

# The Arrow Flight SQL JDBC driver that DBeaver loads: the newest release and the previous
# major line, from Maven Central, checked against Central's SHA-1.
JDBC=$CACHE/jdbc
mkdir -p "$JDBC"
JARS=""
for v in 18.3.0 17.0.0; do
  jar=$JDBC/flight-sql-jdbc-driver-$v.jar
  if [ ! -s "$jar" ]; then
    echo "== fetching flight-sql-jdbc-driver $v"
    base=https://repo.maven.apache.org/maven2/org/apache/arrow/flight-sql-jdbc-driver/$v/flight-sql-jdbc-driver-$v.jar
    curl -fsSL --retry 3 -o "$jar.part" "$base"
    want=$(curl -fsSL --retry 3 "$base.sha1" | cut -c1-40)
    got=$(sha1sum "$jar.part" | cut -c1-40)
    [ "$want" = "$got" ] || { echo "error: $jar: SHA-1 $got, Maven Central says $want" >&2; exit 1; }
    mv "$jar.part" "$jar"
  fi
  JARS=${JARS:+$JARS:}$jar
done
command -v java >/dev/null || { echo "error: java (17+) is needed for the JDBC driver tests" >&2; exit 2; }
# The TPC-H smoke test makes its cluster's CA and certificates with openssl (installed from
# the Debian registry when missing, as PostgreSQL is below).
if ! command -v openssl >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing openssl (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null
fi
command -v openssl >/dev/null || { echo "error: openssl is needed for the TPC-H cluster smoke test's certificates (apt-get install openssl)" >&2; exit 2; }

# Java test peers, each resolved by Maven from scripts/NAME/pom.xml into $CACHE/NAME/lib
# (again only when the pom changes): `resolve_java_peer NAME WHAT`.
resolve_java_peer() {
  local dir=$CACHE/$1 pom=$ROOT/scripts/$1/pom.xml
  if [ ! -f "$dir/.installed" ] || ! cmp -s "$pom" "$dir/.installed"; then
    echo "== resolving $2 (Maven)"
    command -v mvn >/dev/null || { echo "error: Maven (mvn) is needed to fetch $2" >&2; exit 2; }
    rm -rf "$dir" && mkdir -p "$dir"
    mvn -q -B -f "$pom" dependency:copy-dependencies -DoutputDirectory="$dir/lib" -DincludeScope=runtime
    cp "$pom" "$dir/.installed"
  fi
}
# Iceberg's own REST catalog server (org.apache.iceberg.rest.RESTCatalogServer, from the
# iceberg-open-api test fixtures) with its runtime classpath; the REST catalog tests start
# it on a loopback port.
resolve_java_peer rest-catalog "Iceberg's REST catalog server"
REST=$CACHE/rest-catalog
# Hive's standalone metastore 3.1 (Derby) for the Hive Metastore catalog tests.
resolve_java_peer hive-metastore "Hive's standalone metastore"
HMS=$CACHE/hive-metastore
# Iceberg's Spark runtime (one shaded jar) for pyspark.
resolve_java_peer spark "Iceberg's Spark runtime"
SPARK=$CACHE/spark
SPARK_JAR=$(ls "$SPARK"/lib/iceberg-spark-runtime-*.jar)

# DataFusion's own sqllogictest files (the datafusion-sqllogictest crate of the DataFusion
# version ClearIce runs on), checked against the crate's SHA-256 on crates.io; the
# conformance test runs them through `clearice slt`.
DFSLT_VERSION=53.1.0
DFSLT_SHA256=04e5a4a7a49143a68936992b6dbb0db44121c635e9992b2482817278f1e69c56
DFSLT=$CACHE/datafusion-sqllogictest-$DFSLT_VERSION
if [ ! -d "$DFSLT/test_files" ]; then
  echo "== fetching datafusion-sqllogictest $DFSLT_VERSION's test files"
  crate=$CACHE/datafusion-sqllogictest-$DFSLT_VERSION.crate
  curl -fsSL --retry 3 -o "$crate" \
    "https://static.crates.io/crates/datafusion-sqllogictest/datafusion-sqllogictest-$DFSLT_VERSION.crate"
  got=$(sha256sum "$crate" | cut -c1-64)
  [ "$got" = "$DFSLT_SHA256" ] || { echo "error: $crate: SHA-256 $got, want $DFSLT_SHA256" >&2; exit 1; }
  tar xzf "$crate" -C "$CACHE"
  rm -f "$crate"
fi

INTEROP=$CACHE/interop
echo "== generating the interop lake in $INTEROP"
rm -rf "$INTEROP"
"$VENV/bin/python" "$SHARED/interop/make_fixtures.py" "$INTEROP" > "$CACHE/make_fixtures.log" 2>&1 \
  || { cat "$CACHE/make_fixtures.log"; exit 1; }

# Tables as Spark leaves them (merge-on-read deletes, deletion vectors, equality deletes,
# PME-encrypted data and delete files, refs), with Spark's own answers; needs the
# interop lake's keyring.
SPARK_LAKE=$CACHE/spark-lake
echo "== writing the Spark lake in $SPARK_LAKE (pyspark, local mode)"
rm -rf "$SPARK_LAKE" && mkdir -p "$SPARK_LAKE"
"$VENV/bin/python" "$ROOT/crates/engine/tests/python/spark_tables.py" "$SHARED/interop/make_fixtures.py" \
  "$SPARK_JAR" "$INTEROP/keyring.json" "$SPARK_LAKE" > "$CACHE/spark_tables.log" 2>&1 \
  || { cat "$CACHE/spark_tables.log"; exit 1; }

# Tables Iceberg encrypts itself (format v3 `encryption.key-id`), written by Spark through
# Iceberg's Hive catalog (a metastore started for it; its Derby database is kept for the
# tests) with a keyring KeyManagementClient (scripts/spark/KeyringKms.java, compiled here).
SPARK_NATIVE=$CACHE/spark-native
echo "== writing Spark's natively encrypted tables in $SPARK_NATIVE (pyspark, Hive catalog)"
rm -rf "$SPARK_NATIVE" && mkdir -p "$SPARK_NATIVE"
"$VENV/bin/python" "$ROOT/crates/engine/tests/python/spark_native.py" "$SPARK_JAR" "$HMS/lib/*" \
  "$INTEROP/keyring.json" "$ROOT/scripts/spark/KeyringKms.java" "$SPARK_NATIVE" > "$CACHE/spark_native.log" 2>&1 \
  || { cat "$CACHE/spark_native.log"; exit 1; }

# A PostgreSQL server for the PostgreSQL Iceberg catalog tests: a throwaway cluster on a
# free loopback port, stopped when this script exits.
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$PGBIN" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing PostgreSQL"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
[ -n "$PGBIN" ] || { echo "error: PostgreSQL server binaries not found (apt-get install postgresql)" >&2; exit 2; }
PGDIR=$(mktemp -d /tmp/clearice-pg.XXXXXX)
PGPORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$PGDIR"
echo "== starting PostgreSQL on 127.0.0.1:$PGPORT"
as_pg "'$PGBIN/initdb' -D '$PGDIR/data' -A trust -U postgres > '$PGDIR/initdb.log' 2>&1" \
  || { cat "$PGDIR/initdb.log"; exit 1; }
as_pg "'$PGBIN/pg_ctl' -D '$PGDIR/data' -o \"-p $PGPORT -k '$PGDIR' -c listen_addresses=127.0.0.1\" -l '$PGDIR/server.log' -w start" >/dev/null \
  || { cat "$PGDIR/server.log"; exit 1; }
trap 'as_pg "\"$PGBIN/pg_ctl\" -D \"$PGDIR/data\" -m fast stop" >/dev/null 2>&1; rm -rf "$PGDIR"' EXIT
export CLEARICE_PG_URI="postgres://postgres@127.0.0.1:$PGPORT/postgres"

# A Prometheus server (and promtool) for the metrics test: it scrapes `clearice serve` and
# a worker, and lints the exposition.
if ! command -v prometheus >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing Prometheus (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
command -v prometheus >/dev/null && command -v promtool >/dev/null \
  || { echo "error: prometheus and promtool are needed for the metrics test (apt-get install prometheus)" >&2; exit 2; }
export CLEARICE_PROMETHEUS=$(command -v prometheus)

# Debian's Chromium and ChromeDriver: the Superset test drives SQL Lab headless.
if ! { command -v chromium && command -v chromedriver; } >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "== installing Chromium and ChromeDriver (apt)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
{ command -v chromium && command -v chromedriver; } >/dev/null \
  || { echo "error: chromium and chromedriver are needed for the Superset test (apt-get install chromium chromium-driver)" >&2; exit 2; }
export CLEARICE_CHROMIUM=$(command -v chromium) CLEARICE_CHROMEDRIVER=$(command -v chromedriver)

export CLEARICE_INTEROP_DIR=$INTEROP
export CLEARICE_SHARED=$SHARED
export CLEARICE_REST_CATALOG_CP="$REST/lib/*"
export CLEARICE_HMS_CP="$HMS/lib/*"
export CLEARICE_SPARK_LAKE=$SPARK_LAKE
export CLEARICE_SPARK_NATIVE=$SPARK_NATIVE
export CLEARICE_SPARK_ICEBERG_JAR=$SPARK_JAR
export CLEARICE_PARQUET_TESTING_DIR=$SHARED/interop/parquet-testing
export CLEARICE_PYTHON=$VENV/bin/python
export CLEARICE_SUPERSET_PYTHON=$SVENV/bin/python
export CLEARICE_DBT=$DVENV/bin/dbt
export CLEARICE_JDBC_JARS=$JARS
export CLEARICE_DATAFUSION_SLT_DIR=$DFSLT
export CLEARICE_REQUIRE_FIXTURES=1
# Debug builds poll deep async plans (planning under the policy, native-table scans) on
# test threads and tokio workers: 8 MiB stacks, as the CLI's runtimes have.
export RUST_MIN_STACK=${RUST_MIN_STACK:-8388608}

# The fuzz targets (fuzz/: cargo fuzz on nightly, libFuzzer): the Thrift footer code of the
# plaintext view, PME key material, the policy parser; each runs FUZZ_SECONDS (default 30)
# from the seeds in fuzz/seeds, and a crash fails the run (its input is kept in
# fuzz/artifacts).
fuzz() {
  echo "== fuzz targets (${FUZZ_SECONDS:-30} s each)"
  if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal
  fi
  if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --version 0.13.2
  fi
  (
    cd "$ROOT/fuzz"
    cargo +nightly fuzz build -s none
    for t in thrift_footer key_material policy_parse; do
      corpus=$CACHE/fuzz-corpus/$t
      mkdir -p "$corpus"
      seeds=()
      [ -d "seeds/$t" ] && seeds=("seeds/$t")
      cargo +nightly fuzz run -s none "$t" "$corpus" "${seeds[@]}" -- \
        -max_total_time="${FUZZ_SECONDS:-30}" -rss_limit_mb=2048 -print_final_stats=1 \
        || { echo "error: fuzz target $t failed (its input is in fuzz/artifacts/$t)" >&2; exit 1; }
    done
  )
}

echo "== cargo test"
if [ $# -gt 0 ]; then
  cargo test "$@"
else
  cargo test --locked --workspace
  echo "== the demo, policy and writes suites (policy and writes over Flight SQL too) with the lakes on S3"
  # --workspace: the binary `cargo test --workspace` built (same features), not a rebuild.
  CLEARICE_DEMO_ON_S3=1 cargo test --locked --workspace --test sqllogictests -- demo/ policy/ writes/
  fuzz
fi
