"""A small CPU training loop over images read through ucstage.

``VolumeDataset`` yields local paths of cached files; a decoding wrapper (here
``ImageDataset``: PIL -> float tensors) turns them into samples, and ucstage's
``DataLoader`` batches them, times every batch and refuses to start if ranks
disagree. The model learns each image's mean colour, so any folder of images
will do.

    python docs/examples/train_images.py --make-sample /tmp/images   # 96 small PNGs
    python docs/examples/train_images.py /tmp/images --epochs 2
    python docs/examples/train_images.py /Volumes/main/ml/train/images --mlflow
    torchrun --nproc_per_node=2 docs/examples/train_images.py /tmp/images

Needs torch and pillow (and mlflow for --mlflow).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from collections.abc import Iterator

import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.utils.data import IterableDataset

from ucstage import DataLoader, VolumeDataset

IMAGE_GLOBS = ["*.png", "*.jpg", "*.jpeg"]


class ImageDataset(IterableDataset):  # type: ignore[type-arg]
    """Decodes the paths a VolumeDataset yields into (image, target) tensors.

    The wrapper holds the VolumeDataset as an attribute, so ucstage's
    DataLoader finds it: it freezes the listing once and checks that every
    rank shards the same one.
    """

    def __init__(self, paths: VolumeDataset, size: int = 32) -> None:
        self.paths = paths
        self.size = size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for path in self.paths:
            with Image.open(path) as img:
                rgb = img.convert("RGB").resize((self.size, self.size))
                raw = rgb.tobytes()
            pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
            image = pixels.view(self.size, self.size, 3).permute(2, 0, 1).float() / 255
            yield image, image.mean(dim=(1, 2))


def make_sample(folder: str, count: int = 96, seed: int = 0) -> None:
    """Write ``count`` small solid-ish PNGs into class folders under ``folder``."""
    rng = random.Random(seed)
    for i in range(count):
        channel = i % 3
        label = ("red", "green", "blue")[channel]
        base = [rng.randint(0, 80) for _ in range(3)]
        base[channel] = rng.randint(150, 255)
        img = Image.new("RGB", (48, 48), tuple(base))
        for _ in range(20):  # a little noise so images differ
            x, y = rng.randrange(48), rng.randrange(48)
            img.putpixel((x, y), tuple(rng.randint(0, 255) for _ in range(3)))
        os.makedirs(os.path.join(folder, label), exist_ok=True)
        img.save(os.path.join(folder, label, f"img{i:04d}.png"))


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 3),
    )


def train(args: argparse.Namespace) -> tuple[list[dict[str, float]], DataLoader]:
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    net: nn.Module = model()
    if distributed:
        net = nn.parallel.DistributedDataParallel(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    # equal_length="pad": every rank gets the same number of batches, so DDP
    # never waits at the end of an epoch for a rank with one more.
    paths = VolumeDataset(args.source, include=IMAGE_GLOBS, shuffle=True, seed=0,
                          equal_length="pad" if distributed else False)
    # num_workers is part of the shard plan: pass the same value on every rank
    # (never the machine's CPU count), or leave it out for ucstage's default 6.
    loader = DataLoader(ImageDataset(paths), batch_size=args.batch_size,
                        num_workers=args.num_workers)
    report = []
    for epoch in range(args.epochs):
        paths.set_epoch(epoch)
        total, images = 0.0, 0
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(net(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(x)
            images += len(x)
        stats = loader.epoch_stats[-1]
        row = {"epoch": epoch, "images": images, "batches": stats.batches,
               "loss": total / max(images, 1), "stall_share": stats.stall_share,
               "wait_p95_ms": stats.wait_p95_ms}
        report.append(row)
        rank = dist.get_rank() if distributed else 0
        print(f"[rank {rank}] epoch {epoch}: {images} images in {stats.batches} batches, "
              f"loss {row['loss']:.4f}, waited for data {stats.stall_share:.0%} of the epoch "
              f"(p95 {stats.wait_p95_ms:.1f} ms)", file=sys.stderr)
    if distributed:
        dist.destroy_process_group()
    return report, loader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", nargs="?", help="folder, /Volumes/... path, URL or manifest")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--mlflow", action="store_true",
                        help="log the loader's wait metrics to an MLflow run")
    parser.add_argument("--json", action="store_true", help="print per-epoch results as JSON")
    parser.add_argument("--make-sample", metavar="DIR", help="write sample PNGs to DIR and exit")
    args = parser.parse_args()
    if args.make_sample:
        make_sample(args.make_sample)
        print(f"wrote sample images to {args.make_sample}", file=sys.stderr)
        return 0
    if not args.source:
        parser.error("give a SOURCE (or --make-sample DIR)")
    if args.mlflow:
        import mlflow

        with mlflow.start_run(run_name="ucstage-train-images") as run:
            report, loader = train(args)
            loader.flush_metrics()
        metrics = mlflow.tracking.MlflowClient().get_run(run.info.run_id).data.metrics
        print(f"MLflow run {run.info.run_id} ({mlflow.get_tracking_uri()}): "
              + ", ".join(sorted(metrics)), file=sys.stderr)
    else:
        report, _ = train(args)
    if args.json:
        print(json.dumps(report))
    return 0 if all(math.isfinite(r["loss"]) for r in report) else 1


if __name__ == "__main__":
    sys.exit(main())
