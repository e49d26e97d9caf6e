#!/usr/bin/env bash
# Runs every test: installs the pinned Python packages (PyArrow, PyIceberg, DuckDB, ADBC;
# Superset's SQLAlchemy dialect in a second venv) into virtualenvs, generates the
# PyArrow/PyIceberg interop lake, then runs the Rust unit, integration, doc and
# sqllogictest suites with those fixtures required.
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
VENV=$CACHE/venv
REQ=$ROOT/scripts/requirements-test.txt
STAMP=$VENV/.installed
if [ ! -f "$STAMP" ] || ! cmp -s "$REQ" "$STAMP"; then
  echo "== installing Python test packages into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQ"
  cp "$REQ" "$STAMP"
fi

# Superset's SQLAlchemy dialect pins SQLAlchemy 1.4: a venv of its own.
SVENV=$CACHE/venv-superset
SREQ=$ROOT/scripts/requirements-superset.txt
if [ ! -f "$SVENV/.installed" ] || ! cmp -s "$SREQ" "$SVENV/.installed"; then
  echo "== installing Superset's Flight SQL dialect into $SVENV"
  python3 -m venv "$SVENV"
  "$SVENV/bin/pip" install --quiet --disable-pip-version-check -r "$SREQ"
  cp "$SREQ" "$SVENV/.installed"
fi

INTEROP=$CACHE/interop
echo "== generating the interop lake in $INTEROP"
rm -rf "$INTEROP"
"$VENV/bin/python" "$SHARED/interop/make_fixtures.py" "$INTEROP" > "$CACHE/make_fixtures.log" 2>&1 \
  || { cat "$CACHE/make_fixtures.log"; exit 1; }

export CLEARICE_INTEROP_DIR=$INTEROP
export CLEARICE_PARQUET_TESTING_DIR=$SHARED/interop/parquet-testing
export CLEARICE_PYTHON=$VENV/bin/python
export CLEARICE_SUPERSET_PYTHON=$SVENV/bin/python
export CLEARICE_REQUIRE_FIXTURES=1

echo "== cargo test"
if [ $# -gt 0 ]; then
  cargo test "$@"
else
  cargo test --workspace
fi
