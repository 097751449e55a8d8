#!/usr/bin/python3
"""fedfleet's built-in models as PyTorch modules, to load what `fedfleet model export` writes.

A built-in model ("logreg", "mlp", "cnn", "lenet") exports as a state_dict whose keys are the
ones these definitions give ("fc1.weight", ...), so that

    import fedfleet_models
    net = fedfleet_models.load("model.pt", "mlp")             # Fashion-MNIST's 1x28x28, 10 classes
    net = fedfleet_models.load("model.pt", "mlp", input=(4,), classes=3)   # 4 CSV features

gives the trained network. `fedfleet model info --db F` prints the name, input and classes of a
run's model. The input is normalised as fedfleet normalises it: feature vectors as they are in
the file; image bytes v as v / (255 * 0.3530) - 0.2860 / 0.3530 (`normalise_pixels`).

A flat export (`--format flat`: FILE and FILE.json) loads with `load_flat`. A TorchScript model
exports as the module itself: `torch.jit.load(path)`.

The other way, `model.init = "FILE"` starts a run from such a file, or from weights trained in
Python saved as a plain dict (LibTorch cannot read Python's OrderedDict):

    torch.save(dict(net.state_dict()), "init.pt")

Run as a script, it evaluates an exported model on an IDX or CSV test set and prints its
accuracy (see --help).
"""
import argparse
import collections
import gzip
import json
import math
import struct
from typing import Sequence, Tuple

import numpy as np
import torch
from torch import nn

FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


def build(name: str, input: Sequence[int] = (1, 28, 28), classes: int = 10) -> nn.Module:
    """The untrained network `name` for samples of shape `input` and `classes` classes."""
    flat_in = math.prod(input)
    layers = {
        "logreg": lambda: [("flatten", nn.Flatten()), ("fc", nn.Linear(flat_in, classes))],
        "mlp": lambda: [
            ("flatten", nn.Flatten()),
            ("fc1", nn.Linear(flat_in, 200)),
            ("relu1", nn.ReLU()),
            ("fc2", nn.Linear(200, 200)),
            ("relu2", nn.ReLU()),
            ("fc3", nn.Linear(200, classes)),
        ],
        "cnn": lambda: [
            ("conv1", nn.Conv2d(1, 32, 5, padding=2)),
            ("relu1", nn.ReLU()),
            ("pool1", nn.MaxPool2d(2)),
            ("conv2", nn.Conv2d(32, 64, 5, padding=2)),
            ("relu2", nn.ReLU()),
            ("pool2", nn.MaxPool2d(2)),
            ("flatten", nn.Flatten()),
            ("fc1", nn.Linear(7 * 7 * 64, 512)),
            ("relu3", nn.ReLU()),
            ("fc2", nn.Linear(512, classes)),
        ],
        "lenet": lambda: [
            ("conv1", nn.Conv2d(1, 6, 5, padding=2)),
            ("relu1", nn.ReLU()),
            ("pool1", nn.MaxPool2d(2)),
            ("conv2", nn.Conv2d(6, 16, 5)),
            ("relu2", nn.ReLU()),
            ("pool2", nn.MaxPool2d(2)),
            ("flatten", nn.Flatten()),
            ("fc1", nn.Linear(400, 120)),
            ("relu3", nn.ReLU()),
            ("fc2", nn.Linear(120, 84)),
            ("relu4", nn.ReLU()),
            ("fc3", nn.Linear(84, classes)),
        ],
    }
    if name not in layers:
        raise ValueError(f"unknown built-in model {name!r} (valid: {', '.join(layers)})")
    if name in ("cnn", "lenet") and tuple(input) != (1, 28, 28):
        raise ValueError(f"model {name!r} takes 1x28x28 images, not {tuple(input)}")
    return nn.Sequential(collections.OrderedDict(layers[name]()))


def load(path: str, name: str, input: Sequence[int] = (1, 28, 28), classes: int = 10) -> nn.Module:
    """The built-in model `name` with the weights of a state_dict export."""
    net = build(name, input, classes)
    net.load_state_dict(torch.load(path))
    return net.eval()


def load_flat(path: str) -> Tuple[dict, dict]:
    """A flat export: (its description from PATH.json, a state_dict of its tensors)."""
    with open(path + ".json") as f:
        desc = json.load(f)
    if desc["dtype"] != "float32" or desc["byte_order"] != "little":
        raise ValueError(f"{path}.json: not a little-endian float32 buffer")
    flat = np.fromfile(path, dtype="<f4")
    if flat.size != desc["total"]:
        raise ValueError(f"{path}: {flat.size} values, its description says {desc['total']}")
    state = collections.OrderedDict()
    for t in desc["tensors"]:
        n = math.prod(t["shape"])
        state[t["name"]] = torch.from_numpy(flat[t["offset"]:t["offset"] + n].copy()).reshape(t["shape"])
    return desc, state


def normalise_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 images [N, rows, cols] -> float [N, 1, rows, cols] as fedfleet feeds them."""
    scale = np.float32(1.0) / (np.float32(255.0) * np.float32(FASHION_MNIST_STD))
    shift = np.float32(FASHION_MNIST_MEAN) / np.float32(FASHION_MNIST_STD)
    x = images.astype(np.float32) * scale - shift
    return torch.from_numpy(x).unsqueeze(1)


def read_idx(images_path: str, labels_path: str, limit: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """An IDX image/label pair (plain or gzip) -> (normalised images, labels)."""
    def raw(path):
        with open(path, "rb") as f:
            data = f.read()
        return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data

    img, lbl = raw(images_path), raw(labels_path)
    n, rows, cols = struct.unpack(">III", img[4:16])
    images = np.frombuffer(img, dtype=np.uint8, offset=16).reshape(n, rows, cols)
    labels = np.frombuffer(lbl, dtype=np.uint8, offset=8)
    if limit:
        images, labels = images[:limit], labels[:limit]
    return normalise_pixels(images), torch.from_numpy(labels.astype(np.int64))


def read_csv(path: str, features: Sequence[str], label: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """A CSV file with a header row -> (float32 features in the given column order, labels)."""
    with open(path) as f:
        header = f.readline().strip().split(",")
    cols = [header.index(c) for c in features] if features else [
        i for i, c in enumerate(header) if c != label]
    table = np.loadtxt(path, delimiter=",", skiprows=1, usecols=cols + [header.index(label)],
                       dtype=np.float64, ndmin=2)
    x = torch.from_numpy(table[:, :-1].astype(np.float32))
    return x, torch.from_numpy(table[:, -1].astype(np.int64))


@torch.no_grad()
def accuracy(net, x: torch.Tensor, y: torch.Tensor, batch: int = 500) -> float:
    right = 0
    for i in range(0, len(y), batch):
        right += int((net(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum())
    return right / len(y)


def main() -> int:
    p = argparse.ArgumentParser(description="Accuracy of a model `fedfleet model export` wrote.")
    p.add_argument("model_file")
    p.add_argument("--format", choices=["state_dict", "torchscript", "flat"], required=True)
    p.add_argument("--model", help="built-in model name (state_dict, flat)")
    p.add_argument("--input", default="1,28,28", help="sample shape, e.g. 4 or 1,28,28")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--idx", nargs=2, metavar=("IMAGES", "LABELS"), help="IDX test pair")
    p.add_argument("--limit", type=int, default=0, help="first N IDX samples")
    p.add_argument("--csv", help="CSV test file")
    p.add_argument("--features", default="", help="CSV feature columns, comma-separated")
    p.add_argument("--label", default="label", help="CSV label column")
    a = p.parse_args()
    shape = tuple(int(d) for d in a.input.split(","))
    if a.format == "torchscript":
        net = torch.jit.load(a.model_file).eval()
    elif a.format == "flat":
        _, state = load_flat(a.model_file)
        net = build(a.model, shape, a.classes)
        net.load_state_dict(state)
        net.eval()
    else:
        net = load(a.model_file, a.model, shape, a.classes)
    if a.idx:
        x, y = read_idx(a.idx[0], a.idx[1], a.limit)
    else:
        x, y = read_csv(a.csv, [c for c in a.features.split(",") if c], a.label)
    print(f"accuracy {accuracy(net, x, y):.6f} samples {len(y)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
