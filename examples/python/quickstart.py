#!/usr/bin/python3
"""fedfleet from Python: your own PyTorch model, with BatchNorm, trained federatedly on
Fashion-MNIST by 1,000 simulated phones and boards; accuracy plotted over virtual time; the
trained model back as a PyTorch module and evaluated in plain PyTorch.

    /usr/bin/python3 examples/python/quickstart.py [--rounds N] [--out DIR]

Needs the fedfleet package (README, "Python"), Debian's dataset-fashion-mnist, and for the plot
python3-matplotlib (without it the curve is written as CSV).
"""
import argparse
import os
import sys

import torch
from torch import nn

import fedfleet
from fedfleet import models

HERE = os.path.dirname(os.path.abspath(__file__))
FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


class SmallCnn(nn.Module):
    """Two convolutions, each with BatchNorm, and a linear head: 1x28x28 images, 10 classes."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.bn1 = nn.BatchNorm2d(16)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.bn2 = nn.BatchNorm2d(32)
        self.head = nn.Linear(32 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = torch.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.head(torch.flatten(x, 1))


def plot(rounds, path_png: str) -> str:
    """Test accuracy over virtual time, as a PNG (or a CSV without matplotlib); the path."""
    span = rounds["end_time"].max()
    unit, scale = ("hours", 3600) if span > 7200 else ("minutes", 60) if span > 120 else \
        ("seconds", 1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        path = path_png[:-4] + ".csv"
        rounds[["round", "end_time", "test_accuracy"]].to_csv(path, index=False)
        return path
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(rounds["end_time"] / scale, 100 * rounds["test_accuracy"], marker="o")
    ax.set_xlabel(f"virtual time ({unit})")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("SmallCnn on Fashion-MNIST, 1,000 simulated devices")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path_png, dpi=100)
    return path_png


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--out", default="quickstart-out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    # The main job's fleet: 1,000 mobile-mix devices online 16 h a day, 50 sampled a round.
    config = fedfleet.Config(os.path.join(HERE, "..", "configs", "sim_mobile_mix.toml"),
                             rounds=args.rounds, **{"run.name": "python-quickstart"})
    torch.manual_seed(0)
    run = fedfleet.simulate(config, model=SmallCnn(), db=os.path.join(args.out, "history.db"))

    rounds = run.rounds()
    print(rounds[["round", "end_time", "completed", "late", "dropped", "test_accuracy"]]
          .to_string(index=False))
    print(f"plot: {plot(rounds, os.path.join(args.out, 'accuracy.png'))}")

    # The best checkpoint as a PyTorch module, evaluated here on the 10,000 test images,
    # normalised as fedfleet normalises them.
    net = run.model("best")
    x, y = models.read_idx(os.path.join(FASHION_MNIST, "t10k-images-idx3-ubyte.gz"),
                           os.path.join(FASHION_MNIST, "t10k-labels-idx1-ubyte.gz"))
    acc = models.accuracy(net, x, y)
    recorded = rounds["test_accuracy"].max()
    print(f"best round's accuracy: {100 * recorded:.2f}% in the history, "
          f"{100 * acc:.2f}% in plain PyTorch")
    torch.jit.save(net, os.path.join(args.out, "model.pt"))
    print(f"model:   {os.path.join(args.out, 'model.pt')} (torch.jit.load)")
    print(f"history: {run.path}")
    return 0 if abs(acc - recorded) < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
