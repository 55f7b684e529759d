#!/usr/bin/env bash
# Build the wheel and the sdist the way a user or a package index would, install the
# wheel into a fresh venv (no repository, no dev extras on the path) and run the
# installed command. Catches what the editable install of the suite cannot: a module
# or data file missing from the package, metadata setuptools refuses, a dependency the
# core imports but does not declare. Called by scripts/test.sh; about 15 s here.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log="$tmp/log"
quiet() { "$@" >"$log" 2>&1 || { cat "$log" >&2; echo "check_package: failed: $*" >&2; exit 1; }; }

# An isolated build (build's default): setuptools comes from build-system.requires, not
# from .venv, so the pin there is what is tested. Given a folder, build makes the sdist
# first and the wheel from the unpacked sdist: a file the sdist lacks fails the wheel.
quiet "$PY" -m build --outdir "$tmp/dist" .
sdist=$(ls "$tmp"/dist/ucstage-*.tar.gz)
wheel=$(ls "$tmp"/dist/ucstage-*.whl)

# Every tracked file of the package is in both; the sdist also has what a build reads.
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)
root="ucstage-$version"
tar tzf "$sdist" | sed "s|^$root/||" | sort >"$tmp/sdist.txt"
"$PY" -m zipfile -l "$wheel" | awk 'NR > 1 {print $1}' | sort >"$tmp/wheel.txt"
tracked=$(git ls-files ucstage | grep -v '/__pycache__/')  # fails loudly outside a checkout
[ -n "$tracked" ] || { echo "check_package: git lists no files under ucstage/" >&2; exit 1; }
missing=0
for f in pyproject.toml README.md; do
  grep -qxF "$f" "$tmp/sdist.txt" || { echo "check_package: sdist lacks $f" >&2; missing=1; }
done
while read -r f; do
  grep -qxF "$f" "$tmp/sdist.txt" || { echo "check_package: sdist lacks $f" >&2; missing=1; }
  grep -qxF "$f" "$tmp/wheel.txt" || { echo "check_package: wheel lacks $f" >&2; missing=1; }
done <<<"$tracked"
[ "$missing" = 0 ] || exit 1
"$PY" -m zipfile -e "$wheel" "$tmp/unzipped" >/dev/null
grep -qx 'License-Expression: Apache-2.0' "$tmp"/unzipped/ucstage-*.dist-info/METADATA \
  || { echo "check_package: the wheel's METADATA has no SPDX License-Expression" >&2; exit 1; }

# A fresh venv gets only the wheel and its declared dependencies (click, rich, fsspec,
# pyarrow, numpy, pinned by the suite's constraints).
quiet "$PY" -m venv "$tmp/venv"
quiet "$tmp/venv/bin/python" -m pip install --disable-pip-version-check \
  -c scripts/constraints.txt "$wheel"

# Run it from outside the repository, with nothing of the checkout importable.
mkdir -p "$tmp/data/cats" "$tmp/data/dogs"
for i in 1 2 3; do
  echo "cat $i" >"$tmp/data/cats/$i.txt"
  echo "dog $i" >"$tmp/data/dogs/$i.txt"
done
(
  cd "$tmp"
  unset PYTHONPATH
  where=$(venv/bin/python -c 'import ucstage; print(ucstage.__file__)')
  case "$where" in
    "$tmp"/venv/*) ;;
    *) echo "check_package: imported ucstage from $where, not the installed wheel" >&2; exit 1 ;;
  esac
  got=$(venv/bin/ucstage --version)
  [ "$got" = "ucstage, version $version" ] \
    || { echo "check_package: ucstage --version printed '$got'" >&2; exit 1; }
  venv/bin/ucstage shard-plan data --world-size 2 --num-workers 3 >"$log" 2>&1 \
    || { cat "$log" >&2; echo "check_package: ucstage shard-plan failed" >&2; exit 1; }
  grep -q 'every file is read exactly once' "$log" \
    || { cat "$log" >&2; echo "check_package: unexpected shard-plan output" >&2; exit 1; }
)
echo "check_package: $(basename "$wheel") and $(basename "$sdist") build, install and run" >&2
