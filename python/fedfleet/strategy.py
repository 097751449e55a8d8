"""fedfleet.Strategy: your own aggregation rule, in Python, as the engine's aggregator.

    class Median(fedfleet.Strategy):
        def aggregate_fit(self, round, results):
            return torch.stack([r.delta for r in results]).median(dim=0).values

    fedfleet.simulate(config, strategy=Median())         # or fedfleet.serve(..., strategy=...)

The engine calls the strategy where its own aggregators sit (aggregation.method = "custom"):
after every check it makes of an update (the token, the claimed samples bounded by what the
client's partition holds, finite values, the norm bound, clipping to aggregation.clip_norm), so
a strategy sees only updates the engine accepted, and at the round's end asks for the step.

- aggregate_fit(round, results) -> the pseudo-gradient G: a flat float tensor of the model's P
  values (its layout: `Run.model_info()["tensors"]`). The model then moves as with the built-in
  methods, through the server optimiser: x += coordinator.server_lr x G with
  aggregation.server_optimizer = "fedavg" (FedAvg's G is the weighted mean of the deltas).
- results: the round's accepted updates as `Update`s (client id, samples, steps, weight, delta:
  a flat float32 tensor of P values). They are held until the round settles: K x P floats.
- accumulate(update), when the strategy defines it, receives each accepted update as it
  completes instead, and nothing is held for it (aggregate_fit then gets results = []): the
  memory of a running sum.

An exception in either fails the round cleanly: the round is recorded failed with the error's
text, the model stays as it was, the run goes on. A strategy runs in synchronous rounds
(policy.mode = "sync"), not with secure aggregation (which sums masked updates: the engine
refuses every method but fedavg and fednova there) and not in decentralised runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional

import numpy as np
import torch


@dataclass
class Update:
    """One accepted update of a round."""
    client: str           # the client's id: its authenticated key's name
    samples: float        # the samples it trained, as the engine bounded them
    steps: int            # its local steps
    weight: float         # its aggregation weight n_k: the samples its chunks declared
    delta: torch.Tensor   # its model delta, flat float32 [P], clipped if clip_norm is set


class Strategy:
    """Subclass and define aggregate_fit (and accumulate, to stream)."""

    def aggregate_fit(self, round: int, results: List[Update]) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} defines no aggregate_fit")


class FedAvg(Strategy):
    """The weighted mean of the deltas (weights: the updates' samples), streamed: the built-in
    fedavg's rule, to subclass or wrap."""

    def __init__(self):
        self._sum: Optional[torch.Tensor] = None
        self._weight = 0.0

    def accumulate(self, update: Update) -> None:
        d = update.delta.double() * update.weight
        self._sum = d if self._sum is None else self._sum + d
        self._weight += update.weight

    def aggregate_fit(self, round: int, results: List[Update]) -> torch.Tensor:
        if self._sum is None or self._weight <= 0:
            raise ValueError(f"round {round}: no update to average")
        g = (self._sum / self._weight).float()
        self._sum, self._weight = None, 0.0
        return g


class TrimmedMean(Strategy):
    """Coordinate-wise mean after dropping the floor(beta K) largest and smallest values of each
    coordinate (Yin et al., ICML 2018), unweighted: the built-in trimmed_mean's rule."""

    def __init__(self, beta: float = 0.1):
        if not 0 <= beta < 0.5:
            raise ValueError("beta must be in [0, 0.5)")
        self.beta = beta

    def aggregate_fit(self, round: int, results: List[Update]) -> torch.Tensor:
        stacked = torch.stack([r.delta for r in results])
        k = int(math.floor(self.beta * len(results) + 1e-9))
        kept = stacked.sort(dim=0).values[k:len(results) - k]
        return kept.double().mean(dim=0).float()


class Median(Strategy):
    """Coordinate-wise median (Yin et al., ICML 2018), unweighted."""

    def aggregate_fit(self, round: int, results: List[Update]) -> torch.Tensor:
        stacked = torch.stack([r.delta for r in results]).sort(dim=0).values
        m = len(results)
        if m % 2:
            return stacked[m // 2]
        return ((stacked[m // 2 - 1].double() + stacked[m // 2].double()) / 2).float()


# ---- Called by the engine (python/src/strategy.cc), with the GIL held ----

def _receive(strategy, held: list, client: str, samples: float, steps: int, weight: float,
             values: np.ndarray) -> None:
    update = Update(client, samples, int(steps), weight, torch.from_numpy(values))
    accumulate = getattr(strategy, "accumulate", None)
    if accumulate is not None:
        accumulate(update)
    else:
        held.append(update)


def _aggregate(strategy, round: int, held: list, n: int) -> np.ndarray:
    g = strategy.aggregate_fit(int(round), held)
    g = torch.as_tensor(g).detach().to(torch.float32).reshape(-1)
    if g.numel() != n:
        raise ValueError(f"aggregate_fit returned {g.numel()} values for a model of {n}")
    return g.contiguous().numpy()
