#!/usr/bin/python3
"""Your own training loop as a real fedfleet client: a torchvision MobileNetV3 trained with data
augmentation and AdamW inside fedfleet.Client.fit, three such clients over CURVE against a
coordinator served from this process.

    /usr/bin/python3 examples/python/custom_client.py [--rounds N] [--out DIR]

It writes CURVE keys, the scripted model and the coordinator's test set (1,000 Fashion-MNIST
test images) into DIR, runs the coordinator with fedfleet.serve(wait=False), starts three
client processes (this script with --client NAME), each training its own 600 Fashion-MNIST
images, and prints the rounds. Needs the fedfleet package, python3-torchvision and Debian's
dataset-fashion-mnist.
"""
import argparse
import os
import subprocess
import sys

import torch
import torchvision
from torch import nn

import fedfleet
from fedfleet import models

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def images(split: str, start: int, count: int):
    """Fashion-MNIST images [start, start + count) as 3x32x32 floats (padded, the grey
    channel repeated), normalised as fedfleet normalises them, and their labels."""
    prefix = "train" if split == "train" else "t10k"
    x, y = models.read_idx(os.path.join(FASHION_MNIST, f"{prefix}-images-idx3-ubyte.gz"),
                           os.path.join(FASHION_MNIST, f"{prefix}-labels-idx1-ubyte.gz"),
                           limit=start + count)
    x = nn.functional.pad(x[start:], (2, 2, 2, 2)).repeat(1, 3, 1, 1)
    return x.contiguous(), y[start:].contiguous()


class AugmentedAdamW(fedfleet.Client):
    """fit: random crops and flips of its own images, AdamW at the task's learning rate, and
    FedProx's term when the task asks for it."""

    def __init__(self, net: torch.jit.ScriptModule, x: torch.Tensor, y: torch.Tensor, seed: int):
        self.net, self.x, self.y, self.seed = net, x, y, seed
        self.augment = nn.Sequential(
            torchvision.transforms.RandomCrop(32, padding=2),
            torchvision.transforms.RandomHorizontalFlip())

    def fit(self, weights, task):
        torch.manual_seed(self.seed + task.round)
        self.net.load_state_dict(weights, strict=False)
        self.net.train()
        opt = torch.optim.AdamW(self.net.parameters(), lr=task.lr, weight_decay=1e-4)
        losses = []
        for _ in range(task.epochs):
            for idx in torch.randperm(len(self.y)).split(task.batch_size):
                opt.zero_grad()
                out = self.net(self.augment(self.x[idx]))
                loss = nn.functional.cross_entropy(out, self.y[idx]) + task.prox(self.net)
                loss.backward()
                opt.step()
                losses.append(loss.item())
        return fedfleet.FitResult(weights=self.net.state_dict(), samples=len(self.y),
                                  steps=len(losses), loss=sum(losses) / len(losses))


def run_one_client(args) -> int:
    i = int(args.client.rsplit("-", 1)[1])
    x, y = images("train", (i - 1) * 600, 600)
    client = AugmentedAdamW(torch.jit.load(args.model), x, y, seed=i)
    fedfleet.run_client(client, coordinator=args.endpoint, keys=args.keys, id=args.client,
                        model_path=args.model)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="custom-client-out")
    ap.add_argument("--client", help=argparse.SUPPRESS)  # one client process (started below)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--keys", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.client:
        return run_one_client(args)

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    keys = os.path.join(out, "keys")
    fedfleet.keygen(keys, clients=3, force=True)
    torch.manual_seed(0)
    model = os.path.join(out, "model.pt")
    torch.jit.save(torch.jit.script(torchvision.models.mobilenet_v3_small(num_classes=10)), model)
    config = fedfleet.Config(rounds=args.rounds, **{
        "run.name": "custom-client", "coordinator.clients_per_round": 3,
        "coordinator.wait_clients_s": 120, "coordinator.deadline_s": 300,
        "data.partition": "none", "data.num_classes": 10, "train.lr": 0.002,
        "train.batch": 32, "train.epochs": 1})
    server = fedfleet.serve(config, model=torch.jit.load(model), test=images("test", 0, 1000),
                            keys=keys, db=os.path.join(out, "history.db"),
                            bind="tcp://127.0.0.1:*", wait=False)
    with server:
        clients = [subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--client", f"client-{i}", "--endpoint",
             server.endpoint, "--keys", keys, "--model", server.config["model.path"]])
            for i in (1, 2, 3)]
        run = server.wait()
        for c in clients:
            c.wait(timeout=60)
    print(run.rounds()[["round", "status", "completed", "test_accuracy"]].to_string(index=False))
    print(f"history: {run.path}")
    return 0 if all(c.returncode == 0 for c in clients) else 1


if __name__ == "__main__":
    sys.exit(main())
