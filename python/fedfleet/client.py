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
the client keeps serving. SCAFFOLD tasks are refused (the client keeps no control variate).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

from . import _core
from ._jobs import run_job


@dataclass
class Task:
    """What the coordinator asks of this round (its hyper-parameters are the config's train.*)."""
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
    start: Dict[str, torch.Tensor] = field(repr=False, default_factory=dict)

    def prox(self, module: torch.nn.Module) -> torch.Tensor:
        """FedProx's proximal term mu/2 ||w - w_start||^2 over the module's parameters that
        the task's weights name: add it to the loss to honour a FedProx task (0 otherwise)."""
        if self.prox_mu == 0:
            return torch.zeros(())
        total = torch.zeros(())
        for name, p in module.named_parameters():
            if name in self.start:
                total = total + (p - self.start[name].to(p.device)).pow(2).sum()
        return 0.5 * self.prox_mu * total


@dataclass
class FitResult:
    """What fit() returns: the new weights or the delta (a dict in the task's layout; names it
    lacks are unchanged), the samples it holds (FedAvg's weight), and optionally the steps it
    took and its mean loss."""
    samples: int
    weights: Optional[Dict[str, torch.Tensor]] = None
    delta: Optional[Dict[str, torch.Tensor]] = None
    steps: int = 0
    loss: float = 0.0


class Client:
    """Subclass and define fit(weights, task) -> FitResult."""

    def fit(self, weights: Dict[str, torch.Tensor], task: Task) -> FitResult:
        raise NotImplementedError(f"{type(self).__name__} defines no fit")


def _fit(client: Client, values: np.ndarray, names, shapes, offsets, task: dict):
    """Called by the runtime (python/src/client.cc) with the GIL held: the task's start values
    in, (delta float32 [P], samples, steps, mean loss) out."""
    start = torch.from_numpy(values)
    weights = {}
    for name, shape, offset in zip(names, shapes, offsets):
        n = int(np.prod(shape)) if len(shape) else 1
        weights[name] = start[offset:offset + n].reshape(tuple(shape)).clone()
    t = Task(start={k: v.clone() for k, v in weights.items()}, **task)
    result = client.fit(weights, t)
    if not isinstance(result, FitResult):
        raise TypeError(f"fit returned a {type(result).__name__}, not a fedfleet.FitResult")
    if (result.weights is None) == (result.delta is None):
        raise ValueError("a FitResult holds weights or delta, one of the two")
    delta = torch.zeros_like(start)
    given = result.weights if result.weights is not None else result.delta
    # Integer buffers (BatchNorm's num_batches_tracked) stay with each copy of the model: a
    # state_dict's are not in the layout, and are left out here.
    unknown = [k for k in set(given) - set(weights)
               if torch.as_tensor(given[k]).is_floating_point()]
    if unknown:
        raise KeyError(f"fit returned tensors the model does not have: {sorted(unknown)[:5]}")
    for name, shape, offset in zip(names, shapes, offsets):
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
    if result.samples <= 0:
        raise ValueError("a FitResult needs samples > 0 (the data this client trained on)")
    return delta.numpy(), int(result.samples), int(result.steps), float(result.loss)


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

    cfg = as_config(config).update(more)
    if coordinator is not None:
        cfg["client.coordinator"] = coordinator
    if keys is not None:
        cfg["client.keys_dir"] = os.path.abspath(os.fspath(keys))
    if id is not None:
        cfg["client.id"] = id
    if model_path is not None:
        cfg["model.name"] = "torchscript"
        cfg["model.path"] = os.path.abspath(os.fspath(model_path))
    job = _core.Client(cfg._c, client, insecure)
    try:
        run_job(job, False, 0, "client")
    finally:
        job.close()
