#!/usr/bin/python3
"""Probe of upload codecs on the FedAvg CNN in plain PyTorch: fp32, top-k, low rank, FetchSGD.

A quick, framework-free check of what a codec costs in accuracy before it is built into
fedfleet: the loop of fedavg_pytorch.py (Fashion-MNIST, 100 clients Dirichlet(0.5), 10 a round,
E = 1, B = 32, lr 0.05) with each client's update passed through a codec, bytes counted as the
codec would send them (no framing). Codecs:
  none      fp32
  topk      per tensor, the --ratio largest magnitudes (fp16 value + 4-byte index); tensors
            under 10,000 elements whole as fp16; error feedback per client (--ef)
  lowrank   per tensor of 10,000 elements or more, read as [shape[0], rest]: rank --rank (fc1) or
            --rank_conv (conv2) by exact SVD (--exact 1) or by randomised subspace iteration
            (--iters rounds, no oversampling), fp16 factors; smaller tensors as fp16; error
            feedback per client (--ef)
  fetchsgd  Rothchild et al., ICML 2020: each client sends a count sketch (--rows x --cols fp32)
            of its update; the server keeps momentum (--rho) and error sketches and applies the
            --k largest coordinates it unsketches (their estimates; momentum zeroed there)
Prints the test accuracy every --eval_every rounds with the bytes sent and the ratio to fp32.
Run with Debian's python3-torch: /usr/bin/python3 bench/baselines/codec_probe.py --codec lowrank
"""
import argparse
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fedavg_pytorch import load, dirichlet_split, FedAvgCnn  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--codec", default="none")
ap.add_argument("--rounds", type=int, default=10)
ap.add_argument("--rank", type=int, default=12)
ap.add_argument("--rank_conv", type=int, default=8)
ap.add_argument("--ratio", type=float, default=0.01)
ap.add_argument("--ef", type=int, default=1)
ap.add_argument("--exact", type=int, default=0)
ap.add_argument("--iters", type=int, default=2)
ap.add_argument("--cols", type=int, default=6000)
ap.add_argument("--rows", type=int, default=5)
ap.add_argument("--k", type=int, default=50000)
ap.add_argument("--rho", type=float, default=0.9)
ap.add_argument("--slr", type=float, default=1.0)
ap.add_argument("--eval_every", type=int, default=5)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--data", default=os.environ.get("FEDFLEET_FASHION_MNIST_DIR",
                                                 "/usr/share/datasets/fashion-mnist"))
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(1)
rng = np.random.default_rng(1)
xtr, ytr = load(args.data, True)
xte, yte = load(args.data, False)
parts = dirichlet_split(ytr.numpy(), 100, 0.5, rng)
g = FedAvgCnn(); local = FedAvgCnn()
names = [n for n, _ in g.named_parameters()]
shapes = [p.shape for p in g.parameters()]
residual = {}  # client -> list of tensors
bytes_up = 0

def topk_enc(d):
    out = []; nb = 0
    for t in d:
        if t.numel() < 10000:
            out.append(t.half().float()); nb += 2 * t.numel(); continue
        k = max(1, int(round(args.ratio * t.numel())))
        flat = t.flatten(); idx = flat.abs().topk(k).indices
        s = torch.zeros_like(flat); s[idx] = flat[idx].half().float()
        out.append(s.view_as(t)); nb += 6 * k
    return out, nb

def lowrank_enc(d):
    out = []; nb = 0
    for t in d:
        if t.numel() < 10000:
            out.append(t.half().float()); nb += 2 * t.numel(); continue
        m = t.reshape(t.shape[0], -1)
        r = args.rank if m.numel() > 500000 else args.rank_conv
        if args.exact:
            U, S, Vh = torch.linalg.svd(m, full_matrices=False)
            P = (U[:, :r] * S[:r]).half().float(); Q = Vh[:r].half().float()
            out.append((P @ Q).view_as(t)); nb += 2 * r * (m.shape[0] + m.shape[1])
        else:
            Y = m @ torch.randn(m.shape[1], r)
            Y, _ = torch.linalg.qr(Y)
            for _ in range(args.iters):
                Z, _ = torch.linalg.qr(m.T @ Y)
                Y, _ = torch.linalg.qr(m @ Z)
            Q = m.T @ Y
            ps = Y.abs().amax(0).clamp_min(1e-30); qs = Q.abs().amax(0).clamp_min(1e-30)
            Ph = (Y / ps).half().float(); Qh = (Q / qs).half().float()
            out.append(((Ph * (ps * qs)) @ Qh.T).view_as(t)); nb += 2 * r * (m.shape[0] + m.shape[1]) + 4 * r + 4
    return out, nb

# FetchSGD: count sketch over the concatenated update.
D = sum(int(np.prod(s)) for s in shapes)
gen = torch.Generator().manual_seed(7)
hb = torch.randint(0, args.cols, (args.rows, D), generator=gen)
hs = torch.randint(0, 2, (args.rows, D), generator=gen).float() * 2 - 1
def sketch(v):
    S = torch.zeros(args.rows, args.cols)
    for r in range(args.rows):
        S[r].index_add_(0, hb[r], hs[r] * v)
    return S
def unsketch(S):
    est = torch.stack([hs[r] * S[r][hb[r]] for r in range(args.rows)])
    return est.median(0).values
Su = torch.zeros(args.rows, args.cols); Se = torch.zeros(args.rows, args.cols)

for rnd in range(1, args.rounds + 1):
    t0 = time.perf_counter()
    chosen = rng.choice(100, 10, replace=False)
    start = [p.detach().clone() for p in g.parameters()]
    total = 0; acc_sum = [torch.zeros_like(p) for p in start]; Ssum = torch.zeros(args.rows, args.cols)
    for c in chosen:
        idx = torch.from_numpy(parts[c])
        with torch.no_grad():
            for p, s in zip(local.parameters(), start): p.copy_(s)
        opt = torch.optim.SGD(local.parameters(), lr=0.05)
        perm = idx[torch.randperm(len(idx))]
        for b in range(0, len(perm), 32):
            sel = perm[b:b + 32]; opt.zero_grad()
            F.cross_entropy(local(xtr[sel]), ytr[sel]).backward(); opt.step()
        n = len(idx); total += n
        with torch.no_grad():
            d = [p - s for p, s in zip(local.parameters(), start)]
            if args.codec == "none":
                sent = d; nb = 4 * sum(t.numel() for t in d)
            elif args.codec == "fetchsgd":
                v = torch.cat([t.flatten() for t in d])
                Ssum += n * sketch(v); nb = 4 * args.rows * args.cols; sent = None
            else:
                if args.ef and c in residual: d = [a + b for a, b in zip(d, residual[c])]
                sent, nb = (topk_enc if args.codec == "topk" else lowrank_enc)(d)
                if args.ef: residual[c] = [a - b for a, b in zip(d, sent)]
            bytes_up += nb
            if sent is not None:
                for a, t in zip(acc_sum, sent): a.add_(t, alpha=float(n))
    with torch.no_grad():
        if args.codec == "fetchsgd":
            Su.mul_(args.rho).add_(Ssum / total); Se.add_(args.slr * Su)
            est = unsketch(Se); idx = est.abs().topk(args.k).indices
            delta = torch.zeros(D); delta[idx] = est[idx]
            Sd = sketch(delta); Se.sub_(Sd)
            # momentum stopping: zero momentum cells hit by the extracted coordinates
            for r in range(args.rows): Su[r][hb[r][idx]] = 0
            off = 0
            for p, s in zip(g.parameters(), start):
                m = p.numel(); p.copy_(s + delta[off:off + m].view_as(p)); off += m
        else:
            for p, s, a in zip(g.parameters(), start, acc_sum): p.copy_(s + a / total)
        if rnd % args.eval_every == 0 or rnd == args.rounds:
            g.eval(); correct = 0
            for b in range(0, 10000, 1000):
                correct += (g(xte[b:b + 1000]).argmax(1) == yte[b:b + 1000]).sum().item()
            print(f"round {rnd} acc {100 * correct / 10000:.2f} MB_up {bytes_up / 1e6:.2f} "
                  f"x {4 * D * 10 * rnd / bytes_up:.1f} ({time.perf_counter() - t0:.1f}s)", flush=True)
