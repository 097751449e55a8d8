#!/usr/bin/python3
"""A strategy in Python: FedAvg with server momentum (FedAvgM, Hsu et al. 2019) in twenty
lines, run on a simulated fleet and compared with plain FedAvg.

    /usr/bin/python3 examples/python/fedavgm_strategy.py [--rounds N]
"""
import argparse

import torch

import fedfleet


class FedAvgM(fedfleet.Strategy):
    """v <- beta v + (weighted mean of the deltas); the model moves by v."""

    def __init__(self, beta: float = 0.9):
        self.beta = beta
        self.velocity = None

    def aggregate_fit(self, round, results):
        weights = torch.tensor([r.weight for r in results], dtype=torch.float64)
        deltas = torch.stack([r.delta.double() for r in results])
        mean = (weights[:, None] * deltas).sum(0) / weights.sum()
        self.velocity = mean if self.velocity is None else self.beta * self.velocity + mean
        return self.velocity.float()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    # FedProx's Synthetic(1, 1): 100 devices of their own distribution, 10 sampled a round.
    config = fedfleet.Config(rounds=args.rounds, **{
        "data.format": "synthetic", "model.name": "logreg", "sim.clients": 100,
        "coordinator.clients_per_round": 10, "train.lr": 0.01, "run.seed": 7})
    plain = fedfleet.simulate(config, progress=False)
    momentum = fedfleet.simulate(config, strategy=FedAvgM(beta=0.9), progress=False)
    for name, run in (("FedAvg", plain), ("FedAvgM (Python)", momentum)):
        acc = run.rounds()["test_accuracy"]
        print(f"{name:18s} accuracy after {args.rounds} rounds: {100 * acc.iloc[-1]:.2f}% "
              f"(best {100 * acc.max():.2f}%)")


if __name__ == "__main__":
    main()
