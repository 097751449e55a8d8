"""The real deployment from Python: CURVE keys (fedfleet.keygen) and the coordinator service in
this process (fedfleet.serve), on the same engine as `fedfleet coordinator`. The clients are
`fedfleet client` processes (docs/DEPLOY.md), on this host or others."""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Sequence, Union

from . import _core, _inputs
from ._jobs import run_job
from .config import Config, absolute_path
from .history import Run, _run_command
from .simulate import as_config, files_folder


def keygen(dir: Union[str, os.PathLike] = "keys", *, clients: int = 0,
           names: Sequence[str] = (), coordinator: bool = True, prefix: str = "client-",
           force: bool = False) -> Dict[str, str]:
    """Writes CURVE key pairs as `fedfleet keygen` does: the coordinator's (coordinator=True),
    `clients` client pairs named PREFIX1..PREFIXN and one per name, secret files mode 0600, the
    clients' public keys also in DIR/clients/ (the coordinator's allow-list). Existing files
    are an error unless force=True. Returns {name: path of its public key}."""
    dir = os.fspath(dir)
    args = ["keygen", "--dir", dir, "--prefix", prefix]
    if coordinator:
        args.append("--coordinator")
    if clients:
        args += ["--clients", str(int(clients))]
    for n in names:
        args += ["--name", n]
    if force:
        args.append("--force")
    _run_command(args)
    written = (["coordinator"] if coordinator else []) + \
        [f"{prefix}{i}" for i in range(1, int(clients) + 1)] + list(names)
    return {n: os.path.abspath(os.path.join(dir, n + ".key")) for n in written}


class Server:
    """A coordinator running in this process (fedfleet.serve(..., wait=False)): clients connect
    to `endpoint`; wait() returns the Run once the run ends, stop() ends it early."""

    def __init__(self, job: "_core.Coordinator", config: Config, db: str, rounds: int,
                 progress):
        self._job = job
        self.config = config  # as it runs: model.path names the scripted model to give clients
        self._db = db
        self._rounds = rounds
        self._progress = progress
        self.endpoint = job.bound_endpoint
        self.run_id = job.run_id
        job.start()

    def stop(self) -> None:
        """Asks the coordinator to stop (as SIGINT does): the history keeps what was
        committed."""
        self._job.stop()

    def wait(self, timeout: Optional[float] = None) -> Optional[Run]:
        """Waits for the run's end (at most timeout seconds: None when it has not ended)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._job.wait(0.1):
                self._job.take_rounds()
                if deadline is not None and time.monotonic() >= deadline:
                    return None
        except KeyboardInterrupt:
            self._job.stop()
            while not self._job.wait(0.1):
                pass
            self._job.close()
            raise
        self._job.check()
        self._job.close()
        return Run(self._db, self.run_id, {"run_id": self.run_id})

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        if self._job.wait(0):
            self._job.close()
            return
        self.stop()
        while not self._job.wait(0.1):
            pass
        self._job.close()


def serve(config: Union[Config, str, os.PathLike, dict, None] = None, *, model: Any = None,
          test: Any = None, keys: Optional[Union[str, os.PathLike]] = None,
          db: Optional[Union[str, os.PathLike]] = None, bind: Optional[str] = None,
          progress: Union[bool, str] = True, wait: bool = True, strategy: Any = None,
          **more: Any) -> Union[Run, Server]:
    """Runs the coordinator service of `config` in this process (`fedfleet coordinator`):
    it waits for clients, samples them each round, aggregates their updates and records every
    round in `db`.

    model: an nn.Module (scripted; give the clients the same file: Run.model_info()["path"],
      or `fedfleet model export`), a ScriptModule or a built-in name. test: (x, y) tensors or a
      Dataset the coordinator evaluates on (a tensors file). keys: the folder of
      `fedfleet.keygen` (coordinator.key_secret and clients/). bind: the address to listen on
      ("tcp://127.0.0.1:*" picks a free port: Server.endpoint says which). strategy: a
      fedfleet.Strategy that aggregates the clients' updates (aggregation.method "custom").

    wait=True runs to the end and returns the Run (Ctrl-C stops it cleanly); wait=False returns
    a Server at once, with the run going on in this process."""
    cfg = as_config(config).update(more)
    if db is None:
        db = cfg["history.db"]
    db = absolute_path(db)
    cfg["history.db"] = db
    _inputs.apply_inputs(cfg, files_folder(db), model, None, test)
    cfg.update_given({
        "coordinator.keys_dir": absolute_path(keys),
        "coordinator.bind": bind,
        "aggregation.method": None if strategy is None else "custom"})
    cfg.validate()
    job = _core.Coordinator(cfg._c, strategy)
    if not wait:
        return Server(job, cfg, db, int(cfg["run.rounds"]), progress)
    try:
        run_job(job, progress, int(cfg["run.rounds"]), "serve")
        run_id = job.run_id
    finally:
        job.close()
    return Run(db, run_id, {"run_id": run_id})
