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

- configure_fit(round, clients) -> {client id: {setting: value}} or None: per-client
  settings of the round's tasks, asked once a round before they go out (clients: the ids in
  dispatch order). Settings: epochs, max_steps, batch_size, lr, momentum, weight_decay,
  prox_mu; a client left out gets the config's train.*. The engine bounds the steps it accepts
  from a client by its task's settings.
- aggregate_evaluate(round, results) -> (loss, metrics) or None: the round's federated
  evaluation (coordinator.fed_eval_every) from the clients' reports (`EvaluateResult`s),
  recorded in the rounds table (fed_eval_loss; metrics["accuracy"] as fed_eval_accuracy, the
  rest as fed_eval_metrics); None keeps the samples-weighted means the engine computed.

An exception in configure_fit, accumulate or aggregate_fit fails the round cleanly: the round
is recorded failed with the error's text, the model stays as it was, the run goes on (one in
aggregate_evaluate is recorded as an aggregation_error event, and the weighted means stay).

With secure aggregation (secagg.mode = "secagg_plus") the coordinator never sees an update in
the clear, and neither does a strategy: each round it receives one Update, client
"(secure sum)", whose delta is the unmasked weighted mean of the surviving clients' updates
(their masked sum divided by its weight), weight that total weight and samples the number of
survivors. Rules that need each update (median, trimmed mean) then see one row.

A strategy runs in synchronous rounds (policy.mode = "sync"), not in decentralised runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

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


@dataclass
class EvaluateResult:
    """One client's federated evaluation of the model its task carried (on its held-out data)."""
    client: str
    samples: int
    loss: float
    accuracy: Optional[float]   # None for a regression task
    metrics: Dict[str, float]


class Strategy:
    """Subclass and define aggregate_fit (and accumulate, to stream; configure_fit and
    aggregate_evaluate, optionally)."""

    def configure_fit(self, round: int, clients: List[str]) -> Optional[Dict[str, Dict[str, Any]]]:
        return None

    def aggregate_fit(self, round: int, results: List[Update]) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} defines no aggregate_fit")

    def aggregate_evaluate(self, round: int, results: List[EvaluateResult]
                           ) -> Optional[Tuple[float, Dict[str, float]]]:
        return None


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


# The settings configure_fit may give a client: type and allowed range.
_SETTINGS = {
    "epochs": (int, 1, 100000), "max_steps": (int, 0, 1 << 31), "batch_size": (int, 1, 1 << 20),
    "lr": (float, 0.0, 1e6), "momentum": (float, 0.0, 1.0), "weight_decay": (float, 0.0, 1e6),
    "prox_mu": (float, 0.0, 1e9),
}


def _configure(strategy, round: int, clients: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    configure = getattr(strategy, "configure_fit", None)
    got = configure(int(round), list(clients)) if configure is not None else None
    if got is None:
        return {}
    if not isinstance(got, dict):
        raise TypeError(f"configure_fit returned a {type(got).__name__}, not a dict of client "
                        "id -> settings")
    known = set(clients)
    out = {}
    for client, settings in got.items():
        if client not in known:
            raise KeyError(f"configure_fit: {client!r} is not a client of round {round}")
        checked = {}
        for key, value in dict(settings).items():
            if key not in _SETTINGS:
                raise KeyError(f"configure_fit: unknown setting {key!r} (valid: "
                               f"{', '.join(_SETTINGS)})")
            kind, low, high = _SETTINGS[key]
            v = kind(value)
            if not (low <= v <= high) or (key == "lr" and v == 0) or (key == "momentum" and v == 1):
                raise ValueError(f"configure_fit: {client}: {key} = {value!r} is outside "
                                 f"{'(' if key == 'lr' else '['}{low}, {high}"
                                 f"{')' if key == 'momentum' else ']'}")
            checked[key] = v
        out[str(client)] = checked
    return out


def _evaluate(strategy, round: int, results: list):
    evaluate = getattr(strategy, "aggregate_evaluate", None)
    if evaluate is None:
        return None
    got = evaluate(int(round), [EvaluateResult(c, int(n), float(loss), acc, dict(m))
                                for c, n, loss, acc, m in results])
    if got is None:
        return None
    loss, metrics = got
    metrics = {str(k): float(v) for k, v in dict(metrics).items()}
    values = [float(loss), *metrics.values()]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"aggregate_evaluate returned a value that is not finite: {got!r}")
    accuracy = metrics.pop("accuracy", None)
    return float(loss), accuracy, list(metrics.items())
