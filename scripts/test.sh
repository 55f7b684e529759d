#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole suite: lint, types, tests.
# Extra arguments go to pytest, e.g. scripts/test.sh -k shard -x
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
echo "== ruff" >&2
ruff check ucstage tests scripts docs/examples benchmarks
echo "== mypy" >&2
mypy
echo "== pytest" >&2
python -m pytest -q "$@"
