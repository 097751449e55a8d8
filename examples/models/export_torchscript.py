#!/usr/bin/python3
"""Exports a small Fashion-MNIST classifier as TorchScript for fedfleet.

fedfleet trains any TorchScript module that maps float inputs [N, ...] to logits [N, classes]
(here Fashion-MNIST's images [N, 1, 28, 28] to [N, 10]). Its parameters and its floating-point
buffers (BatchNorm running statistics) travel in the flat model and are averaged alike;
integer buffers (num_batches_tracked) stay with each copy. Use the saved file with model name "torchscript"
and its path in model.path (`--model-path`; `--model FILE.pt` sets both):

    /usr/bin/python3 examples/models/export_torchscript.py /tmp/tiny_cnn.pt --seed 1
    fedfleet sim --model torchscript --model-path /tmp/tiny_cnn.pt --rounds 2 \
        --clients 20 --clients-per-round 4 --db :memory:

A coordinator and its clients need the same file (`--model-path` on both). The simulator
counts a TorchScript module's cost as one multiply-add per parameter (sim/model_cost.h).
"""
import argparse

import torch
from torch import nn


class TinyCnn(nn.Module):
    """conv3x3(8) - ReLU - maxpool2 - conv3x3(16) - ReLU - maxpool2 - fc(784 -> 32) - ReLU - fc(10)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(torch.relu(self.fc1(x)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="where to write the TorchScript file (.pt)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights")
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = TinyCnn()
    scripted = torch.jit.script(model)
    # Check the contract before saving: [N, 1, 28, 28] -> [N, 10].
    out = scripted(torch.zeros(2, 1, 28, 28))
    assert tuple(out.shape) == (2, 10), out.shape
    scripted.save(args.output)
    n = sum(p.numel() for p in model.parameters())
    print(f"saved {args.output}: TinyCnn, {n} parameters, seed {args.seed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
