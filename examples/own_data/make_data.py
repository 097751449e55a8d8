#!/usr/bin/python3
"""Writes the two data sets of the "Your own data and model" example into OUT.

  OUT/csv/train.csv, OUT/csv/test.csv   8 numeric features f0..f7 and a "label" column, 4
                                        classes: Gaussian clusters, one centre per class
  OUT/images/train/<class>/*.png,       28x28 grey PNG files from Fashion-MNIST's training and
  OUT/images/test/<class>/*.png         test splits, 3 classes (t-shirt, trouser, sneaker),
                                        named by class as torchvision's ImageFolder expects

    /usr/bin/python3 examples/own_data/make_data.py /tmp/own-data
"""
import argparse
import gzip
import os
import struct

import numpy as np
from PIL import Image

FASHION = "/usr/share/datasets/fashion-mnist"
CLASSES = {0: "t-shirt", 1: "trouser", 7: "sneaker"}


def write_csv(path: str, n: int, centres: np.ndarray, rng: np.random.Generator) -> None:
    labels = np.arange(n) % len(centres)
    x = centres[labels] + rng.normal(0, 1.0, size=(n, centres.shape[1]))
    with open(path, "w") as f:
        f.write(",".join(f"f{j}" for j in range(centres.shape[1])) + ",label\n")
        for row, y in zip(x, labels):
            f.write(",".join(f"{v:.5f}" for v in row) + f",{y}\n")


def read_idx(images: str, labels: str):
    with gzip.open(images) as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        x = np.frombuffer(f.read(), dtype=np.uint8).reshape(n, rows, cols)
    with gzip.open(labels) as f:
        f.read(8)
        y = np.frombuffer(f.read(), dtype=np.uint8)
    return x, y


def write_images(root: str, x, y, per_class: int) -> int:
    written = 0
    for label, name in CLASSES.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in np.flatnonzero(y == label)[:per_class]:
            Image.fromarray(x[i], mode="L").save(os.path.join(root, name, f"{i:05d}.png"))
            written += 1
    return written


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    centres = np.random.default_rng(args.seed).normal(0, 1.5, size=(4, 8))
    os.makedirs(os.path.join(args.out, "csv"), exist_ok=True)
    write_csv(os.path.join(args.out, "csv", "train.csv"), 2000, centres,
              np.random.default_rng(args.seed + 1))
    write_csv(os.path.join(args.out, "csv", "test.csv"), 400, centres,
              np.random.default_rng(args.seed + 2))
    x, y = read_idx(f"{FASHION}/train-images-idx3-ubyte.gz", f"{FASHION}/train-labels-idx1-ubyte.gz")
    n_train = write_images(os.path.join(args.out, "images", "train"), x, y, 400)
    x, y = read_idx(f"{FASHION}/t10k-images-idx3-ubyte.gz", f"{FASHION}/t10k-labels-idx1-ubyte.gz")
    n_test = write_images(os.path.join(args.out, "images", "test"), x, y, 100)
    print(f"wrote {args.out}/csv (2000 + 400 rows) and {args.out}/images "
          f"({n_train} + {n_test} PNG files, 3 classes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
