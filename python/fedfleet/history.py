"""Reading a fedfleet history (the SQLite file every run writes) from Python: its tables as pandas
DataFrames with the columns of `fedfleet history VIEW --format csv`, its checkpoints as PyTorch
modules, and its HTML report. The file is opened read-only; a run that is still writing it may
be read meanwhile."""
from __future__ import annotations

import io
import json
import os
import tempfile
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _core
from ._core import ConfigError, Error


def _run_command(args: List[str]) -> bytes:
    """`fedfleet ARGS` in this process; its stdout, or the error it printed raised."""
    rc, out, err = _core.command(args)
    if rc != 0:
        message = err.strip() or f"fedfleet {' '.join(args)}: exit status {rc}"
        raise (ConfigError if rc == 2 else Error)(message)
    return out


class History:
    """A history file: `History("run.db").rounds()` is `fedfleet history rounds --db run.db
    --format csv` as a DataFrame, cell for cell.

    run=None means what the command means without --run: the latest run for rounds, updates,
    tiers, blocks, served, peers and peer_evals; every run for runs, clients and events."""

    def __init__(self, path: Union[str, os.PathLike]):
        self.path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(self.path):
            raise ConfigError(f"{self.path}: no such history file")

    # The run the views show when run=None (History: as the command; Run: its own).
    def _default_run(self) -> Optional[int]:
        return None

    def _table(self, view: str, run: Optional[int], extra: Sequence[str] = (),
               default_run: bool = True) -> "pandas.DataFrame":
        import pandas as pd

        if run is None and default_run:
            run = self._default_run()
        args = ["history", view, "--db", self.path, "--format", "csv"]
        if run is not None:
            args += ["--run", str(int(run))]
        out = _run_command(args + list(extra))
        if not out.strip():
            return pd.DataFrame()
        # round_trip: each number exactly as the command printed it (pandas' default parser
        # may be off in the last bit).
        return pd.read_csv(io.BytesIO(out), float_precision="round_trip")

    def runs(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """The runs: id, name, start, seed, clock, configuration."""
        return self._table("runs", run, default_run=False)

    def rounds(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """The rounds of a run (test accuracy as a fraction, times on the run's clock)."""
        return self._table("rounds", run)

    def updates(self, run: Optional[int] = None,
                round: Optional[int] = None) -> "pandas.DataFrame":
        """The client updates of a run (of one round)."""
        extra = [] if round is None else ["--round", str(int(round))]
        return self._table("updates", run, extra)

    def clients(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """The clients (of one run: those that took part in it)."""
        return self._table("clients", run, default_run=False)

    def events(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """Recorded events: rejections, refusals, drops, resumes, ..."""
        return self._table("events", run, default_run=False)

    def tiers(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """Completed, late, dropped and rejected updates per fleet tier."""
        return self._table("tiers", run)

    def peers(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """A decentralised run's peers."""
        return self._table("peers", run)

    def peer_evals(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """A decentralised run's evaluations."""
        return self._table("peer-evals", run)

    def blocks(self, run: Optional[int] = None) -> "pandas.DataFrame":
        """A block-cyclic run's per-block accuracy."""
        return self._table("blocks", run)

    def config(self, run: Optional[int] = None) -> "Config":
        """The configuration a run was recorded with (the latest run by default), as a Config:
        saved to TOML, it runs again with `fedfleet sim --config FILE`."""
        from .config import Config

        if run is None:
            run = self._default_run()
        args = ["history", "runs", "--db", self.path, "--format", "json"]
        if run is not None:
            args += ["--run", str(int(run))]
        runs = json.loads(_run_command(args))
        if not runs:
            raise ConfigError(f"{self.path}: holds no run")
        chosen = runs[-1]
        core = _core.Config()
        core.load_json(chosen["config_json"], f"{self.path} (run {chosen['run_id']})")
        return Config._from_core(core)

    def model_info(self, run: Optional[int] = None) -> Dict[str, Any]:
        """The run's model: name, path, input, classes and the layout of its flat buffer."""
        if run is None:
            run = self._default_run()
        args = ["model", "info", "--db", self.path, "--json"]
        if run is not None:
            args += ["--run", str(int(run))]
        return json.loads(_run_command(args))

    def model(self, run: Optional[int] = None, round: Union[None, int, str] = None):
        """A checkpoint of the run as a PyTorch module, as `fedfleet model export` writes it:
        round=None or "last" the latest, "best" the highest test accuracy, or a round number.
        A TorchScript run gives a ScriptModule carrying the trained weights (torch.jit.load); a
        built-in model (mlp, cnn, ...) the nn.Module of fedfleet.models with them. In eval
        mode. model("best") and model("last") name the round alone."""
        import torch

        from . import models

        if isinstance(run, str):
            run, round = None, run
        if run is None:
            run = self._default_run()
        info = self.model_info(run)
        with tempfile.TemporaryDirectory(prefix="fedfleet-model-") as tmp:
            path = os.path.join(tmp, "model.pt")
            args = ["model", "export", "--db", self.path, "-o", path]
            if run is not None:
                args += ["--run", str(int(run))]
            if round == "best":
                args.append("--best")
            elif round == "last":
                args.append("--last")
            elif round is not None:
                args += ["--round", str(int(round))]
            _run_command(args)
            if info["name"] == "torchscript":
                return torch.jit.load(path).eval()
            return models.load(path, info["name"], tuple(info["input"]), info["classes"])

    def report(self, path: Union[str, os.PathLike] = "report.html",
               runs: Optional[Sequence[int]] = None) -> str:
        """Writes the HTML report (`fedfleet report`); its path."""
        path = os.path.abspath(os.fspath(path))
        args = ["report", "--db", self.path, "-o", path]
        for r in runs if runs is not None else ([] if self._default_run() is None
                                                  else [self._default_run()]):
            args += ["--run", str(int(r))]
        _run_command(args)
        return path

    def __repr__(self) -> str:
        return f"fedfleet.History({self.path!r})"


class Run(History):
    """The run just made (by simulate or serve): a History whose views default to this run, and
    the run's summary (`summary`, as the command prints it in `summary["text"]`)."""

    def __init__(self, path: str, run_id: int, summary: Dict[str, Any],
                 workdir: Optional[tempfile.TemporaryDirectory] = None):
        super().__init__(path)
        self.run_id = int(run_id)
        self.summary = summary
        self._workdir = workdir  # a temporary history's folder lives as long as the Run

    def _default_run(self) -> Optional[int]:
        return self.run_id

    def runs(self, run: Optional[int] = None) -> "pandas.DataFrame":
        return super().runs(self.run_id if run is None else run)

    @property
    def final_accuracy(self) -> Optional[float]:
        return self.summary.get("final_accuracy")

    @property
    def best_accuracy(self) -> Optional[float]:
        return self.summary.get("best_accuracy")

    def __repr__(self) -> str:
        return f"fedfleet.Run({self.path!r}, run_id={self.run_id})"
