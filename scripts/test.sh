#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole suite: lint, types, the package, tests.
# Extra arguments go to pytest, e.g. scripts/test.sh -k shard -x
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
python -m pytest -q "$@"
