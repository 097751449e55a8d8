"""Your own training loop for every simulated client: fedfleet.simulate(client_fn=...).

Each virtual client of the main job's fleet (1,000 phones and boards, Fashion-MNIST split
Dirichlet(0.5)) trains the built-in MLP with a loop of its own: AdamW, label smoothing and a
gradient-norm clip, over its shard (task.data) in the built-in trainer's batch order
(task.batches(), seeded per task, so the same seed gives the same history). The simulator's
engine, fleet profile and virtual clock are the command's; only the local training is Python.

    /usr/bin/python3 examples/python/sim_clients.py --rounds 5
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

import fedfleet
from fedfleet import models

HERE = os.path.dirname(os.path.abspath(__file__))


class SmoothedAdamW(fedfleet.Client):
    def __init__(self, k: int):
        self.net = models.build("mlp")

    def fit(self, weights, task):
        self.net.load_state_dict(weights)
        x, y = task.data
        opt = torch.optim.AdamW(self.net.parameters(), lr=1e-3, weight_decay=1e-4)
        total, steps = 0.0, 0
        for idx in task.batches():
            opt.zero_grad()
            loss = F.cross_entropy(self.net(x[idx]), y[idx], label_smoothing=0.1)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 5.0)
            opt.step()
            total += float(loss)
            steps += 1
        return fedfleet.FitResult(weights=self.net.state_dict(), samples=len(y), steps=steps,
                                  loss=total / max(steps, 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    config = fedfleet.Config(os.path.join(HERE, "..", "configs", "sim_mobile_mix.toml"),
                             rounds=args.rounds)
    run = fedfleet.simulate(config, client_fn=SmoothedAdamW, progress="plain")
    r = run.rounds()
    print(r[["round", "end_time", "completed", "test_accuracy"]].to_string(index=False))
    first, last = r["test_accuracy"].iloc[0], r["test_accuracy"].iloc[-1]
    print(f"test accuracy {100 * first:.2f}% -> {100 * last:.2f}% in {args.rounds} rounds "
          f"({r['end_time'].iloc[-1]:.0f} s of virtual time)")
    return 0 if last > first else 1


if __name__ == "__main__":
    sys.exit(main())
