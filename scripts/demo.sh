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

# Print each command so it can be pasted (quoted with %q), run it, show a non-zero exit.
step() { printf '\n\033[1m$'; printf ' %q' "$@"; printf '\033[0m\n'; "$@" || echo "(exit $?)"; }
export OMP_NUM_THREADS=1   # torchrun's banner otherwise; the demo's loops are tiny

python scripts/make_sample_volume.py "$UCSTAGE_VOLUMES_ROOT/main/ml/train"

# Which files each (rank, worker) slot reads, for 2 ranks x 3 DataLoader workers.
step ucstage shard-plan "$VOL" --world-size 2 --num-workers 3 --batch-size 8
# What goes wrong when rank 1 is started with num_workers=2 (exits 1).
step ucstage shard-plan "$VOL" --world-size 2 --num-workers 3,2

# Warm only what rank 1 of 2 (3 workers each) reads, then the rest: rank 1's files are skipped.
step ucstage cache warm "$VOL" --rank 1 --world-size 2 --num-workers 3
step ucstage cache warm "$VOL" --jobs 8
step ucstage cache status
step ucstage cache verify "$VOL" --checksum

# A training-style loop (CPU): VolumeDataset -> PIL decoding -> DataLoader, wait times to MLflow.
step env MLFLOW_ALLOW_FILE_STORE=true MLFLOW_TRACKING_URI="file:$DEMO/mlruns" \
  python docs/examples/train_images.py "$VOL" --epochs 2 --mlflow
# The same on 2 ranks (gloo): each rank reads its half; the cache is already warm.
step torchrun --nproc_per_node=2 --master_addr 127.0.0.1 --master_port 29517 \
  docs/examples/train_images.py "$VOL" --epochs 2

# Is the volume, the cache or the worker count the bottleneck? A 120-file sample read
# direct, through a fresh private cache (cold) and again (warm); chart in .demo/bench.png.
# $VOL is a local folder, so bench says the cache-vs-direct comparison means nothing
# here; the emulated remote volume below is where it does.
step ucstage bench "$VOL" --files 120 --workers 1,2,4 --max-seconds 60 --plot "$DEMO/bench.png"
# As root: the same on an emulated remote volume (moto S3 + rclone FUSE, 2 ms, 1 Gbit/s).
if [[ $(id -u) == 0 ]]; then
  step env DEMO="$DEMO" scripts/remote-volume.sh --small 300x256K --large none -- \
    sh -c 'ucstage bench "$UCSTAGE_REMOTE_MNT/small" --files 200 --workers 1,4,8 --plot "$DEMO/bench-remote.png"'
fi

# A Delta table written with deltalake (write, append, delete), exported to
# Parquet in a volume through the embedded Spark Connect server (Java 17).
python - <<'EOF'
import os
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

path = os.path.join(os.environ["UCSTAGE_WAREHOUSE"], "main", "ml", "events")
def rows(start, n):
    ids = list(range(start, start + n))
    return pa.table({"id": ids, "text": [f"event {i}" for i in ids], "label": [i % 3 for i in ids]})
write_deltalake(path, rows(0, 1000), mode="overwrite")
write_deltalake(path, rows(1000, 500), mode="append")
DeltaTable(path).delete("label = 2")
print(f"Delta table main.ml.events at {path}, version {DeltaTable(path).version()}")
EOF
step ucstage export main.ml.events /Volumes/main/ml/train/events --files 6 --world-size 2 --num-workers 3
# Same table version and options: nothing is rewritten.
step ucstage export main.ml.events /Volumes/main/ml/train/events --files 6 --world-size 2 --num-workers 3
# A bad filter is refused by Spark before anything is written (exits 2).
step ucstage export main.ml.events /Volumes/main/ml/train/events --where "labl = 1"
step ucstage shard-plan /Volumes/main/ml/train/events --unit row-group -w 2 -k 2 --batch-rows 64 --equal-length drop
step python docs/examples/train_table.py /Volumes/main/ml/train/events --epochs 2
step env HF_DATASETS_OFFLINE=1 python -c "import datasets; print(datasets.load_dataset('parquet', data_files='$UCSTAGE_VOLUMES_ROOT/main/ml/train/events/*.parquet', split='train'))"
