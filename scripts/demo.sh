#!/usr/bin/env bash
# Set up (scripts/setup.sh), build a sample volume and run ucstage end to end on
# the embedded defaults: no platform account, everything local.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

DEMO="$PWD/.demo"
export UCSTAGE_VOLUMES_ROOT="$DEMO/volumes"     # /Volumes/... maps here
export UCSTAGE_CACHE_DIR="$DEMO/cache"          # the local cache (default: /tmp/ucstage-<uid>)
export UCSTAGE_WAREHOUSE="$DEMO/warehouse"      # catalog.schema.table maps here
mkdir -p "$UCSTAGE_VOLUMES_ROOT"
VOL=/Volumes/main/ml/train/images

step() { printf '\n\033[1m$ %s\033[0m\n' "$*"; "$@" || echo "(exit $?)"; }

python scripts/make_sample_volume.py "$UCSTAGE_VOLUMES_ROOT/main/ml/train"

# Which files each (rank, worker) slot reads, for 2 ranks x 3 DataLoader workers.
step ucstage shard-plan "$VOL" --world-size 2 --num-workers 3 --batch-size 8
# What goes wrong when rank 1 is started with num_workers=2 (exits 1).
step ucstage shard-plan "$VOL" --world-size 2 --num-workers 3,2
