#!/usr/bin/env python3
"""Build a small sample volume: PNG images in class folders, like a vision dataset.

    python scripts/make_sample_volume.py DEST [--images 240] [--size 64]

Deterministic (seeded), so every machine builds the same bytes. Also writes a
`_SUCCESS` marker, which ucstage skips as Spark does.
"""

from __future__ import annotations

import argparse
import os
import random

from PIL import Image


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("dest")
    ap.add_argument("--images", type=int, default=240)
    ap.add_argument("--size", type=int, default=64)
    args = ap.parse_args()
    rng = random.Random(0)
    classes = ["cat", "dog", "bird"]
    root = os.path.join(args.dest, "images")
    for i in range(args.images):
        label = classes[i % len(classes)]
        folder = os.path.join(root, label)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{i:05d}.png")
        if os.path.exists(path):
            continue
        img = Image.new("RGB", (args.size, args.size),
                        (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
        for _ in range(args.size):  # some texture, so files differ in size
            img.putpixel((rng.randrange(args.size), rng.randrange(args.size)),
                         (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
        img.save(path)
    open(os.path.join(root, "_SUCCESS"), "w").close()
    print(f"sample volume: {args.images} images under {root}")


if __name__ == "__main__":
    main()
