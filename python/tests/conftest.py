"""Shared pieces of the Python package's tests: a small classification task (Gaussian blobs,
fixed seed), a model with BatchNorm, the fedfleet command of this build, and a history digest
that leaves out what measures the host (wall-clock columns), as the golden-history test does."""
import hashlib
import os
import sqlite3
import subprocess

import pytest
import torch
from torch import nn

FEATURES, CLASSES = 8, 4


def blobs(n: int, seed: int):
    """n samples of 4 Gaussian blobs in 8 dimensions: (x float32 [n, 8], y int64 [n])."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(0)) * 1.5
    y = torch.randint(0, CLASSES, (n,), generator=g)
    x = centres[y] + torch.randn(n, FEATURES, generator=g)
    return x, y


class BnNet(nn.Module):
    """Linear -> BatchNorm -> ReLU -> Linear: a user's own module with running statistics."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def small_config(fedfleet, **more):
    """20 virtual clients, 5 a round, iid split, the given rounds."""
    keys = {"run.name": "py-test", "run.seed": 3, "run.rounds": 4, "sim.clients": 20,
            "coordinator.clients_per_round": 5, "data.partition": "iid", "train.lr": 0.1,
            "train.batch": 16, "train.epochs": 1, "sim.workers": 1}
    keys.update(more)
    return fedfleet.Config(**keys)


@pytest.fixture
def data():
    return blobs(2000, seed=1), blobs(500, seed=2)


@pytest.fixture(scope="session")
def fedfleet_bin():
    path = os.environ.get("FEDFLEET")
    if not path:
        pytest.fail("FEDFLEET (the fedfleet program of this build) is not set; run through ctest")
    return path


def run_cli(fedfleet_bin, *args, check=True, timeout=300):
    p = subprocess.run([fedfleet_bin, *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"fedfleet {' '.join(args)} exited {p.returncode}:\n{p.stderr}")
    return p


WALL_CLOCK = {"rounds": {"wall_start", "wall_end"},
              "updates": {"id", "wall_compute_s", "encode_s", "decode_s"},
              "events": {"id"}, "checkpoints": set()}
ORDER = {"rounds": "round", "updates": "id", "events": "id", "checkpoints": "round"}


def history_digest(db: str, run_id: int) -> dict:
    """{table: (rows, sha256 of its values)} of one run; reals by their exact bits."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out = {}
    for table, skip in WALL_CLOCK.items():
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})")
                if r[1] not in skip and r[1] != "run_id"]
        h = hashlib.sha256()
        rows = con.execute(f"SELECT {', '.join(cols)} FROM {table} WHERE run_id = ? "
                           f"ORDER BY {ORDER[table]}", (run_id,)).fetchall()
        for row in rows:
            for v in row:
                h.update((v.hex() if isinstance(v, float) else repr(v)).encode() + b"|")
        out[table] = (len(rows), h.hexdigest())
    con.close()
    return out
