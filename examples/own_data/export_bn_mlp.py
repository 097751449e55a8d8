#!/usr/bin/python3
"""Exports the example's model as TorchScript: an MLP with a BatchNorm layer for 8 features and
4 classes, Linear(8, 32) - BatchNorm1d(32) - ReLU - Linear(32, 4).

fedfleet trains its parameters and federates the BatchNorm's running mean and variance with
them (or keeps them on each client with model.local = ["bn.*"], as FedBN does).

    /usr/bin/python3 examples/own_data/export_bn_mlp.py /tmp/own-data/bn_mlp.pt
"""
import argparse

import torch
from torch import nn


class BnMlp(nn.Module):
    def __init__(self, features: int = 8, classes: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(features, 32)
        self.bn = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.bn(self.fc1(x))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("output")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    scripted = torch.jit.script(BnMlp())
    scripted.eval()
    assert tuple(scripted(torch.zeros(2, 8)).shape) == (2, 4)
    scripted.train()
    scripted.save(args.output)
    print(f"saved {args.output}: BnMlp (8 -> 32 -> BatchNorm -> 4)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
