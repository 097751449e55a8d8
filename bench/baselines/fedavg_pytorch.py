#!/usr/bin/python3
"""Plain-PyTorch FedAvg loop: the baseline the fedfleet benchmarks compare against.

One process, no framework: Fashion-MNIST from the Debian package, N clients split by
Dirichlet(alpha) label skew (NIID-Bench rule: resample until every client has >= 10 samples),
K clients sampled per round, E local epochs of minibatch SGD (batch B, lr), sample-weighted
FedAvg, server-side evaluation on the 10k test set every round. Data tensors are built once; the
per-client loop slices them directly (no DataLoader), which is the fastest plain loop.

Prints one line per round and, last, `RESULT model=... threads=... median_round_s=...
best_round_s=... final_acc=...` (accuracy in percent).
Run with Debian's python3-torch: /usr/bin/python3 bench/baselines/fedavg_pytorch.py --model mlp
"""
import argparse
import gzip
import os
import statistics
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MEAN, STD = 0.2860, 0.3530


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    ndim = magic & 0xFF
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(directory, train):
    prefix = "train" if train else "t10k"
    x = read_idx(os.path.join(directory, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(directory, f"{prefix}-labels-idx1-ubyte.gz"))
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - MEAN) / STD
    return x.unsqueeze(1).contiguous(), torch.from_numpy(y.astype(np.int64))


def dirichlet_split(labels, n_clients, alpha, rng, min_size=10):
    labels = np.asarray(labels)
    while True:
        parts = [[] for _ in range(n_clients)]
        for k in range(labels.max() + 1):
            idx = np.where(labels == k)[0]
            rng.shuffle(idx)
            p = rng.dirichlet(np.repeat(alpha, n_clients))
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for part, chunk in zip(parts, np.split(idx, cuts)):
                part.extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.array(sorted(p)) for p in parts]


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 200)
        self.fc2 = nn.Linear(200, 200)
        self.fc3 = nn.Linear(200, 10)

    def forward(self, x):
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class FedAvgCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * 7 * 7, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--alpha", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data", default=os.environ.get("FEDFLEET_FASHION_MNIST_DIR",
                                                     "/usr/share/datasets/fashion-mnist"))
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    x_train, y_train = load(args.data, True)
    x_test, y_test = load(args.data, False)
    parts = dirichlet_split(y_train.numpy(), args.clients, args.alpha, rng)

    make = Mlp if args.model == "mlp" else FedAvgCnn
    global_model = make()
    local = make()
    round_times = []
    acc = 0.0
    for rnd in range(1, args.rounds + 1):
        t0 = time.perf_counter()
        chosen = rng.choice(args.clients, args.per_round, replace=False)
        start = [p.detach().clone() for p in global_model.parameters()]
        total = 0
        acc_sum = [torch.zeros_like(p) for p in start]
        for c in chosen:
            idx = torch.from_numpy(parts[c])
            with torch.no_grad():
                for p, s in zip(local.parameters(), start):
                    p.copy_(s)
            opt = torch.optim.SGD(local.parameters(), lr=args.lr)
            local.train()
            for _ in range(args.epochs):
                perm = idx[torch.randperm(len(idx))]
                for b in range(0, len(perm), args.batch):
                    sel = perm[b:b + args.batch]
                    opt.zero_grad()
                    loss = F.cross_entropy(local(x_train[sel]), y_train[sel])
                    loss.backward()
                    opt.step()
            n = len(idx)
            total += n
            with torch.no_grad():
                for a, p, s in zip(acc_sum, local.parameters(), start):
                    a.add_(p - s, alpha=float(n))
        with torch.no_grad():
            for p, s, a in zip(global_model.parameters(), start, acc_sum):
                p.copy_(s + a / total)
            global_model.eval()
            correct = 0
            for b in range(0, len(x_test), 1000):
                correct += (global_model(x_test[b:b + 1000]).argmax(1) == y_test[b:b + 1000]).sum().item()
            acc = 100.0 * correct / len(x_test)
        dt = time.perf_counter() - t0
        round_times.append(dt)
        print(f"round {rnd:3d}  acc {acc:6.2f}%  {dt:.3f} s", flush=True)
    print(f"RESULT model={args.model} threads={args.threads} "
          f"median_round_s={statistics.median(round_times):.4f} "
          f"best_round_s={min(round_times):.4f} final_acc={acc:.2f}")


if __name__ == "__main__":
    main()
