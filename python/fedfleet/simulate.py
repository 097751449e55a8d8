"""fedfleet.simulate: a whole fleet on this host, from a script or a notebook cell."""
from __future__ import annotations

import os
import sys
import tempfile
from typing import Any, Callable, Optional, Union

from . import _core, _inputs
from ._jobs import run_job
from .config import Config
from .history import Run


def as_config(config: Union[Config, str, os.PathLike, dict, None]) -> Config:
    """A copy of `config` as a Config (a TOML path, a dict of keys, or a Config)."""
    if config is None:
        return Config()
    if isinstance(config, Config):
        return config.copy()
    if isinstance(config, dict):
        return Config(**config)
    return Config(config)


def files_folder(db: str) -> str:
    """Where the model and data files of a history's runs go: beside it, DB.files/."""
    return os.path.abspath(db) + ".files"


def simulate(config: Union[Config, str, os.PathLike, dict, None] = None, *, model: Any = None,
             train: Any = None, test: Any = None, db: Optional[Union[str, os.PathLike]] = None,
             progress: Union[bool, str] = True, resume: bool = False, strategy: Any = None,
             client_fn: Optional[Callable[[int], Any]] = None,
             max_dataset_bytes: int = _inputs.MAX_DATASET_BYTES, **keys: Any) -> Run:
    """Simulates the fleet of `config` on this host with the coordinator's own round engine
    (`fedfleet sim`), and returns the Run: its history, summary and models.

    model: an nn.Module (scripted here: fedfleet runs it in C++), a ScriptModule, or a built-in
      name ("logreg", "mlp", "cnn", "lenet"); None: the config's model.
    train, test: (x, y) tensors or a torch Dataset of (x, y) samples (materialised once, at
      most max_dataset_bytes), written as a tensors file (data.format = "tensors"); None: the
      config's data (fashion-mnist, synthetic, your files).
    db: the history file (created, or appended to: one file holds many runs); None: a temporary
      one that the Run keeps while it lives. The model and data files go beside it (DB.files/).
    progress: True a tqdm bar (when python3-tqdm is installed; plain lines otherwise), "plain"
      lines on stderr, False nothing.
    resume: continue the interrupted run of this config's run.name in db (`--resume`): the same
      config, model and data give the same history as a run that was never stopped.
    strategy: a fedfleet.Strategy that aggregates instead of the built-in methods
      (aggregation.method becomes "custom"; fedfleet.strategy says what it is given).
    client_fn: k -> a fedfleet.Client whose fit trains virtual client k (0 .. sim.clients-1)
      instead of the built-in trainer; called for every task, on the simulator's sim.workers
      threads (fit holds the GIL except inside PyTorch's kernels). task.data is the client's
      shard; virtual time comes from the fleet profile as for the built-in trainer, so a fit
      that is deterministic given task.seed gives the same history for the same seed. The
      workers share PyTorch's global generator: a fit that draws from it (dropout, randperm
      without a generator) repeats only with sim.workers = 1; draw from
      torch.Generator().manual_seed(task.seed) instead where you can.
      sim.batch_clients does not apply; MPI ranks and decentralised runs refuse it.
    keys: further configuration keys (rounds=30, **{"train.lr": 0.05}).

    Ctrl-C (KeyboardInterrupt) stops the run cleanly: the rounds committed stay in the history
    and resume=True continues from them; the KeyboardInterrupt is raised again. Errors:
    fedfleet.ConfigError for a configuration, model or data fedfleet refuses (the message is the
    command's), fedfleet.Error for a run that failed.
    """
    cfg = as_config(config).update(keys)
    workdir = None
    if db is None:
        if resume:
            raise _core.ConfigError("resume=True needs the db of the run to continue")
        workdir = tempfile.TemporaryDirectory(prefix="fedfleet-run-")
        db = os.path.join(workdir.name, "history.db")
    db = os.path.abspath(os.fspath(db))
    _inputs.apply_inputs(cfg, files_folder(db), model, train, test, max_dataset_bytes)
    cfg["history.db"] = db
    cfg["sim.progress"] = "off"  # the progress shown is this package's
    if resume:
        cfg["coordinator.resume"] = True
    if strategy is not None:
        if cfg["policy.mode"] == "decentralized":
            raise _core.ConfigError("strategy: a decentralised run has no coordinator to "
                                    "aggregate; its peers average as decentralized.algorithm "
                                    "says")
        cfg["aggregation.method"] = "custom"
    cfg.validate()
    job = _core.Simulation(cfg._c, strategy, client_fn)
    try:
        if job.already_finished:
            print(job.already_finished)
            return Run(db, job.run_id, {"run_id": job.run_id}, workdir)
        if cfg["policy.mode"] == "decentralized":
            # Peers iterate on their own clocks: no rounds to show while it runs; the summary
            # says what happened.
            run_job(job, False, 0, "decentralised")
            summary = job.summary()
            if progress:
                print(summary["text"], end="", file=sys.stderr)
        else:
            run_job(job, progress, int(cfg["run.rounds"]), "simulate")
            summary = job.summary()
    finally:
        job.close()
    return Run(db, summary["run_id"], summary, workdir)
