#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh; safe to run again (it only does what is missing).
#   - system tools (as root, when absent): Java 17 for Spark Connect, rclone + fuse3 for
#     FUSE volumes, iproute2 for the emulated remote volume
#   - .venv with torch==2.13.0 installed first (a CPU wheel; an unpinned torch would pull a
#     multi-GB CUDA build), then ucstage with its dev extras.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

need_apt=()
java_ok() { command -v java >/dev/null && java -version 2>&1 | grep -Eq 'version "(1[7-9]|2[0-9])'; }
java_ok || need_apt+=(openjdk-17-jre-headless)
command -v rclone >/dev/null || need_apt+=(rclone)
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v tc >/dev/null || need_apt+=(iproute2)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${need_apt[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "setup: missing ${need_apt[*]} (install them, or run as root so this script can)" >&2
  fi
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
stamp=.venv/.ucstage-installed
want=$(cat pyproject.toml scripts/constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Python packages into .venv (a few minutes the first time)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "is ignored" || true
  # Constraints pin the versions the suite passes with (and keep the resolver fast).
  .venv/bin/python -m pip install -q --disable-pip-version-check -c scripts/constraints.txt \
    -e ".[dev]" 2>&1 | grep -v "is ignored" || true
  .venv/bin/python -c "import ucstage, torch, pyspark, s3fs, obstore, moto" \
    || { echo "setup: Python packages failed to install" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"

# Azurite, the Azure Blob emulator the suite starts (tests/common/cloud.py), from npm into
# .tools/ (ignored by git), only when missing. Node is needed; without it the Azure tests skip
# locally and fail in CI.
AZURITE_VERSION=3.37.0
if [ ! -x .tools/azurite/node_modules/.bin/azurite-blob ] \
   || ! grep -q "\"version\": \"$AZURITE_VERSION\"" .tools/azurite/node_modules/azurite/package.json 2>/dev/null; then
  if command -v npm >/dev/null; then
    echo "setup: installing Azurite $AZURITE_VERSION into .tools/azurite" >&2
    mkdir -p .tools/azurite
    npm install --prefix .tools/azurite --no-audit --no-fund --loglevel=error \
      "azurite@$AZURITE_VERSION" >/dev/null 2>&1 \
      || echo "setup: npm could not install Azurite (the Azure tests need it)" >&2
  else
    echo "setup: npm is missing: the Azure tests need Azurite (install node and npm)" >&2
  fi
fi
