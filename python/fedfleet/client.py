"""fedfleet.Client: your own training loop as a real client of a fedfleet coordinator.

    class MyClient(fedfleet.Client):
        def __init__(self, net, data):
            self.net, self.data = net, data

        def fit(self, weights, task):
            self.net.load_state_dict(weights, strict=False)
            opt = torch.optim.AdamW(self.net.parameters(), lr=task.lr)
            for x, y in loader(self.data, task.batch_size, task.epochs):
                opt.zero_grad()
                loss = F.cross_entropy(self.net(x), y) + task.prox(self.net)   # FedProx
                loss.backward(); opt.step()
            return fedfleet.FitResult(weights=self.net.state_dict(), samples=len(self.data))

    fedfleet.run_client(MyClient(net, data), config="job.toml", id="client-1", keys="keys",
                        coordinator="tcp://10.0.0.5:7700")

run_client runs the C++ client runtime of `fedfleet client` (CURVE, the protocol, heartbeats,
reconnects, the upload pipeline, codecs and error feedback, upload credits, secure
aggregation's masking, local DP, the model's local part) and calls fit() on its training thread,
holding the GIL only inside the call. The weights come in the model's layout (the coordinator's
model: the TorchScript file of model.path, or a built-in model) as a dict of name -> tensor; fit
returns the new weights (or the delta) in the same layout. A fit that raises fails that task
alone: the coordinator records the client's error with the exception's text, cut to 1 KiB, and
the client keeps serving. A SCAFFOLD task carries c - c_k (task.scaffold_shift, which
task.step applies); the runtime keeps c_k and computes its update from the steps fit reports. A
task that asks for a federated evaluation (coordinator.fed_eval_every) calls evaluate() first,
when the client defines it.

The same Client trains virtual clients in fedfleet.simulate(client_fn=lambda k: MyClient(k)):
there task.data holds the virtual client's shard.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import numpy as np
import torch

from . import _core
from ._jobs import run_job
from .config import absolute_path


@dataclass
class Task:
    """What the coordinator asks of this round (its hyper-parameters are the config's train.*).

    A loop that honours everything a task asks, FedProx and SCAFFOLD included, in the
    built-in trainer's batch order (in simulate, where `data` is the client's shard):

        x, y = task.data
        opt = torch.optim.SGD(net.parameters(), lr=task.lr, momentum=task.momentum,
                              weight_decay=task.weight_decay)
        for idx in task.batches():
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            task.step(opt, net)          # opt.step() with FedProx's and SCAFFOLD's corrections
    """
    round: int
    token: int
    model_name: str
    deadline_s: float   # seconds from receipt by which the update must be uploaded (0: none)
    epochs: int
    max_steps: int      # > 0: at most this many optimiser steps
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    prox_mu: float      # FedProx's mu (0: plain FedAvg)
    seed: int
    optimizer: str = "sgd"  # train.optimizer: "sgd", "adam" or "adamw"
    fed_eval: bool = False  # the coordinator asks for evaluate() of the weights (run_client)
    start: Dict[str, torch.Tensor] = field(repr=False, default_factory=dict)
    # simulate(client_fn=...) only: the virtual client's shard, (x, y) as the built-in trainer
    # batches it (images normalised, [n, 1, 28, 28]); None for run_client (bring your data).
    data: Optional[Tuple[torch.Tensor, torch.Tensor]] = field(repr=False, default=None)
    # SCAFFOLD (aggregation.method = "scaffold"): c - c_k per parameter, the correction
    # task.step applies; empty otherwise.
    scaffold_shift: Dict[str, torch.Tensor] = field(repr=False, default_factory=dict)

    def prox(self, module: torch.nn.Module) -> torch.Tensor:
        """FedProx's proximal term mu/2 ||w - w_start||^2 over the module's parameters that
        the task's weights name: add it to the loss to honour a FedProx task (0 otherwise).
        (task.step does the same to the gradients; use one of the two.)"""
        if self.prox_mu == 0:
            return torch.zeros(())
        total = torch.zeros(())
        for name, p in module.named_parameters():
            if name in self.start:
                total = total + (p - self.start[name].to(p.device)).pow(2).sum()
        return 0.5 * self.prox_mu * total

    def step(self, optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> None:
        """optimizer.step() as the built-in trainer takes it, after backward(): FedProx's
        mu (w - w_start) joins each gradient first; SCAFFOLD's c - c_k joins it too with plain
        SGD, or with momentum or Adam moves the weights by -lr (c - c_k) after the step
        (outside the optimiser's state). Without either, just optimizer.step()."""
        after = bool(self.scaffold_shift) and (self.momentum != 0 or self.optimizer != "sgd")
        if self.prox_mu != 0 or (self.scaffold_shift and not after):
            with torch.no_grad():
                for name, p in module.named_parameters():
                    if name not in self.start:
                        continue
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    if self.prox_mu != 0:
                        p.grad.add_(p - self.start[name].to(p.device), alpha=self.prox_mu)
                    if self.scaffold_shift and not after:
                        p.grad.add_(self.scaffold_shift[name].to(p.device))
        optimizer.step()
        if after:
            with torch.no_grad():
                for name, p in module.named_parameters():
                    if name in self.scaffold_shift:
                        p.sub_(self.scaffold_shift[name].to(p.device), alpha=self.lr)

    def batches(self, m: Optional[int] = None, fold_single: bool = False) -> Iterator[torch.Tensor]:
        """The built-in trainer's batches over m samples (len(task.data) by default): for
        each optimiser step, the int64 indices of its samples. A fresh permutation each pass,
        seeded with task.seed as the C++ trainer seeds it; task.max_steps steps when it is set,
        else task.epochs passes. fold_single: a pass's last batch of one sample joins the one
        before it (the trainer does so for models with BatchNorm buffers)."""
        if m is None:
            if self.data is None:
                raise ValueError("batches(): give the number of samples (this task has no data)")
            m = len(self.data[1])
        bsz = self.batch_size
        if m == 0 or bsz == 0:
            return
        fold = fold_single and m > bsz and m % bsz == 1
        per_pass = (m + bsz - 1) // bsz - (1 if fold else 0)
        planned = self.max_steps if self.max_steps > 0 else self.epochs * per_pass
        order = _core.PassOrder(self.seed, m)
        perm = None
        pos = 0
        for _ in range(planned):
            if pos == 0:
                perm = torch.from_numpy(order.next())
            b = bsz + 1 if fold and m - pos == bsz + 1 else min(bsz, m - pos)
            yield perm[pos:pos + b]
            pos += b
            if pos == m:
                pos = 0


@dataclass
class FitResult:
    """What fit() returns: the new weights or the delta (a dict in the task's layout; names it
    lacks are unchanged), the samples it holds (FedAvg's weight; in simulate the client's shard
    size weighs it, as for built-in clients), the optimiser steps it took (0: those the task asks
    for over `samples`; SCAFFOLD's control variate divides by them) and its mean loss."""
    samples: int
    weights: Optional[Dict[str, torch.Tensor]] = None
    delta: Optional[Dict[str, torch.Tensor]] = None
    steps: int = 0
    loss: float = 0.0


@dataclass
class EvalResult:
    """What evaluate() returns: the loss of the weights on the client's held-out data, the
    samples it evaluated, and optionally the accuracy (a fraction) and further metrics."""
    loss: float
    samples: int
    accuracy: Optional[float] = None
    metrics: Dict[str, float] = field(default_factory=dict)


class Client:
    """Subclass and define fit(weights, task) -> FitResult, and optionally
    evaluate(weights, task) -> EvalResult."""

    def fit(self, weights: Dict[str, torch.Tensor], task: Task) -> FitResult:
        raise NotImplementedError(f"{type(self).__name__} defines no fit")

    def evaluate(self, weights: Dict[str, torch.Tensor], task: Task) -> Optional[EvalResult]:
        """Federated evaluation (coordinator.fed_eval_every): the task's weights on this
        client's held-out data, called before fit on the tasks that ask for it. None (the
        default): the client reports no evaluation. In simulate the simulator evaluates each
        virtual client's held-out part of the test split with the run's model itself."""
        return None


def _evaluation_of(result: Any):
    """(samples, loss, accuracy, [(name, value)]) of what evaluate returned, or None."""
    if result is None:
        return None
    if not isinstance(result, EvalResult):
        raise TypeError(f"evaluate returned a {type(result).__name__}, not a "
                        "fedfleet.EvalResult")
    values = [float(result.loss), *(float(v) for v in result.metrics.values())]
    if result.accuracy is not None:
        values.append(float(result.accuracy))
    if not all(np.isfinite(values)):
        raise ValueError(f"evaluate returned a value that is not finite: {result!r}")
    if result.samples < 0:
        raise ValueError("an EvalResult's samples cannot be negative")
    accuracy = None if result.accuracy is None else float(result.accuracy)
    return (int(result.samples), float(result.loss), accuracy,
            [(str(k), float(v)) for k, v in result.metrics.items()])


def _tensors(flat: torch.Tensor, layout) -> Dict[str, torch.Tensor]:
    """Views of the flat values by name (name, shape, offset lists of the layout)."""
    out = {}
    for name, shape, offset in zip(*layout):
        n = int(np.prod(shape)) if len(shape) else 1
        out[name] = flat[offset:offset + n].reshape(tuple(shape))
    return out


def _delta_of(result: Any, task: Task, start: torch.Tensor, weights: Dict[str, torch.Tensor],
              layout):
    """(delta float32 [P], samples, steps, mean loss, None) of what fit returned."""
    if not isinstance(result, FitResult):
        raise TypeError(f"fit returned a {type(result).__name__}, not a fedfleet.FitResult")
    if (result.weights is None) == (result.delta is None):
        raise ValueError("a FitResult holds weights or delta, one of the two")
    if result.samples <= 0:
        raise ValueError("a FitResult needs samples > 0 (the data this client trained on)")
    steps = int(result.steps)
    if steps < 0:
        raise ValueError(f"a FitResult's steps ({steps}) cannot be negative")
    if steps == 0:  # not said: the steps the task asks for over the samples
        per_pass = -(-int(result.samples) // max(task.batch_size, 1))
        steps = task.max_steps if task.max_steps > 0 else task.epochs * per_pass
    delta = torch.zeros_like(start)
    given = result.weights if result.weights is not None else result.delta
    # Integer buffers (BatchNorm's num_batches_tracked) stay with each copy of the model: a
    # state_dict's are not in the layout, and are left out here.
    unknown = [k for k in set(given) - set(weights)
               if torch.as_tensor(given[k]).is_floating_point()]
    if unknown:
        raise KeyError(f"fit returned tensors the model does not have: {sorted(unknown)[:5]}")
    for name, shape, offset in zip(*layout):
        if name not in given:
            continue
        v = torch.as_tensor(given[name]).detach().to("cpu", torch.float32)
        if tuple(v.shape) != tuple(shape):
            raise ValueError(f"{name}: fit returned shape {tuple(v.shape)}, the model has "
                             f"{tuple(shape)}")
        n = v.numel()
        if result.weights is not None:
            v = v - start[offset:offset + n].reshape(tuple(shape))
        delta[offset:offset + n] = v.reshape(-1)
    return delta.numpy(), int(result.samples), steps, float(result.loss), None


def _shift(layout, c: Optional[np.ndarray], ck: Optional[np.ndarray]) -> Dict[str, torch.Tensor]:
    """SCAFFOLD's c - c_k by name (empty without SCAFFOLD)."""
    if c is None:
        return {}
    return _tensors(torch.from_numpy(c) - torch.from_numpy(ck), layout)


def _fit(client: Client, values: np.ndarray, layout, task: dict, c: Optional[np.ndarray] = None,
         ck: Optional[np.ndarray] = None):
    """Called by the client runtime (python/src/client.cc) with the GIL held: the task's start
    values (and SCAFFOLD's c and c_k) in, (delta float32 [P], samples, steps, mean loss,
    evaluation or None) out."""
    start = torch.from_numpy(values)
    weights = {k: v.clone() for k, v in _tensors(start, layout).items()}
    t = Task(start={k: v.clone() for k, v in weights.items()},
             scaffold_shift=_shift(layout, c, ck), **task)
    evaluation = None
    if t.fed_eval:
        evaluation = _evaluation_of(client.evaluate({k: v.clone() for k, v in weights.items()},
                                                    t))
    return _delta_of(client.fit(weights, t), t, start, weights, layout)[:4] + (evaluation,)


def _sim_fit(client_fn: Callable[[int], Client], k: int, values: np.ndarray, layout, task: dict,
             x: np.ndarray, y: np.ndarray, c: Optional[np.ndarray], ck: Optional[np.ndarray]):
    """Called by the simulator (python/src/client.cc) on a worker thread with the GIL held:
    virtual client k's fit over its shard (x, y), as _fit."""
    client = client_fn(k)
    if not isinstance(client, Client):
        raise TypeError(f"client_fn({k}) returned a {type(client).__name__}, not a "
                        "fedfleet.Client")
    start = torch.from_numpy(values)
    weights = {k2: v.clone() for k2, v in _tensors(start, layout).items()}
    t = Task(start={k2: v.clone() for k2, v in weights.items()},
             data=(torch.from_numpy(x), torch.from_numpy(y)), scaffold_shift=_shift(layout, c, ck),
             **task)
    return _delta_of(client.fit(weights, t), t, start, weights, layout)


def run_client(client: Client, config: Any = None, *, coordinator: Optional[str] = None,
               keys: Optional[Union[str, os.PathLike]] = None, id: Optional[str] = None,
               model_path: Optional[Union[str, os.PathLike]] = None, insecure: bool = False,
               **more: Any) -> None:
    """Serves `client` to a coordinator until it says Bye (the run ended), as `fedfleet client`
    does: config (a Config, a TOML path or a dict; its client.* keys), coordinator (the
    address), keys (the folder holding ID.key, ID.key_secret and coordinator.key), id (this
    client's name, its key's), model_path (the run's TorchScript file, when model.name is
    "torchscript"). Ctrl-C stops it cleanly. Errors: fedfleet.ConfigError for missing keys or a
    bad config, fedfleet.Error when the coordinator goes silent past client.exit_idle_s."""
    from .simulate import as_config

    cfg = as_config(config).update(more).update_given({
        "client.coordinator": coordinator,
        "client.keys_dir": absolute_path(keys),
        "client.id": id,
        "model.name": None if model_path is None else "torchscript",
        "model.path": absolute_path(model_path)})
    job = _core.Client(cfg._c, client, insecure)
    try:
        run_job(job, False, 0, "client")
    finally:
        job.close()
