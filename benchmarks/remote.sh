#!/usr/bin/env bash
# Reproduce docs/benchmarks.md "Bench modes on an emulated remote volume":
# build the emulated remote volume (scripts/remote-volume.sh), then compare
# `ucstage cache warm` and `ucstage bench` with cp -r, rclone copy, s5cmd and
# shutil.copytree on it (python -m benchmarks.staging remote), and write
# docs/bench-remote.png. Needs root.
#
#   benchmarks/remote.sh [--server rclone|moto] [--delay 2ms] [--rate 1gbit]
#                        [--small 2000x256K] [--large 16x64M] [--workers 1,2,4,8] [--json FILE]
#
# --server: the volume's S3 server (scripts/remote-volume.sh --server): rclone
# serve s3 by default; moto reproduces the figures before 2026-12-01.
#
# --json FILE: the benchmark's JSON document (docs/benchmarks.md, "The --json
# contract") goes to FILE and its Markdown to stderr.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
delay=2ms rate=1gbit small=2000x256K large=16x64M workers=1,2,4,8 json="" server=rclone
while [[ $# -gt 0 ]]; do
  case $1 in
    --delay) delay=$2; shift 2 ;;
    --server) server=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --small) small=$2; shift 2 ;;
    --large) large=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    *) echo "remote.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-$here/.venv/bin/python}
export PATH=$(dirname "$python"):$PATH UCSTAGE_REMOTE_DELAY=$delay UCSTAGE_REMOTE_RATE=$rate
# The benchmark is a module of this checkout's benchmarks/ package.
export PYTHONPATH=$here${PYTHONPATH:+:$PYTHONPATH}
cmd=("$here/scripts/remote-volume.sh" --server "$server" --delay "$delay" --rate "$rate" --small "$small"
     --large "$large" -- "$python" -m benchmarks.staging remote --workers "$workers"
     --delay "$delay" --rate "$rate")
if [[ -n $json ]]; then
  # remote-volume.sh logs to stderr: stdout is the benchmark's document alone.
  exec "${cmd[@]}" --json >"$json"
fi
exec "${cmd[@]}"
