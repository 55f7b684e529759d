#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole suite: lint, types, the package, tests.
# Extra arguments go to pytest, e.g. scripts/test.sh -k shard -x; the tests
# run on 3 pytest-xdist workers (-n0 or -p no:xdist: one process).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
echo "== ruff" >&2
ruff check ucstage tests scripts docs/examples benchmarks
echo "== mypy" >&2
mypy
echo "== package" >&2
bash scripts/check_package.sh
echo "== pytest" >&2
# Most tests wait (mounts, servers, subprocesses) rather than compute, so 3
# workers beat 2 on 2 cores; tests/conftest.py groups the Spark and torchrun
# tests (--dist loadgroup) so that each heavy part runs on one worker.
xdist=(-n "${UCSTAGE_TEST_WORKERS:-3}" --dist loadgroup)
for arg in "$@"; do
  case "$arg" in *no:xdist) xdist=() ;; esac
done
python -m pytest -q ${xdist[@]+"${xdist[@]}"} "$@"
