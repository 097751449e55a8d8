"""fedfleet.simulate(client_fn=...): a Python client's fit trains the simulator's virtual clients.

The client here runs the built-in trainer's loop in PyTorch (the same batches through
task.batches, torch.optim.SGD, FedProx and SCAFFOLD through task.step), so its updates must equal
the C++ trainer's to float tolerance: the same history, update by update."""
import os
import sqlite3

import pytest
import torch
import torch.nn.functional as F

import fedfleet
from fedfleet import models
from conftest import history_digest

FASHION = os.environ.get("FEDFLEET_FASHION_MNIST_DIR") or "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="module")
def fashion():
    if not os.path.exists(os.path.join(FASHION, "train-images-idx3-ubyte.gz")):
        pytest.fail(f"Fashion-MNIST is not in {FASHION}: scripts/install-deps.sh installs it")
    train = models.read_idx(os.path.join(FASHION, "train-images-idx3-ubyte.gz"),
                            os.path.join(FASHION, "train-labels-idx1-ubyte.gz"), limit=1600)
    test = models.read_idx(os.path.join(FASHION, "t10k-images-idx3-ubyte.gz"),
                           os.path.join(FASHION, "t10k-labels-idx1-ubyte.gz"), limit=400)
    return train, test


class BuiltInLoop(fedfleet.Client):
    """The C++ trainer's loop (client/trainer.cc) over the built-in MLP, in PyTorch."""

    calls = []

    def __init__(self, k):
        self.k = k
        self.net = models.build("mlp")

    def fit(self, weights, task):
        BuiltInLoop.calls.append((task.round, self.k))
        self.net.load_state_dict(weights)
        x, y = task.data
        opt = torch.optim.SGD(self.net.parameters(), lr=task.lr, momentum=task.momentum,
                              weight_decay=task.weight_decay)
        total, steps = 0.0, 0
        for idx in task.batches():
            opt.zero_grad()
            loss = F.cross_entropy(self.net(x[idx]), y[idx])
            loss.backward()
            task.step(opt, self.net)
            total += float(loss) * len(idx)
            steps += 1
        seen = sum(len(i) for i in task.batches())
        return fedfleet.FitResult(weights=self.net.state_dict(), samples=len(y), steps=steps,
                                  loss=total / seen)


def run(fashion, tmp_path, name, client_fn=None, **keys):
    (x, y), (xt, yt) = fashion
    cfg = {"run.name": "sim-client", "run.seed": 5, "run.rounds": 3, "sim.clients": 8,
           "coordinator.clients_per_round": 4, "data.partition": "iid", "train.lr": 0.05,
           "train.batch": 32, "train.epochs": 1, "sim.workers": 2}
    cfg.update(keys)
    return fedfleet.simulate(cfg, model="mlp", train=(x, y), test=(xt, yt),
                             db=tmp_path / f"{name}.db", progress=False, client_fn=client_fn)


def updates(run_):
    con = sqlite3.connect(run_.path)
    rows = con.execute("SELECT round, client_id, status, n_samples, steps, weight, loss "
                       "FROM updates WHERE run_id = ? ORDER BY round, client_id",
                       (run_.run_id,)).fetchall()
    con.close()
    return rows


def flat(net):
    return torch.cat([t.detach().reshape(-1) for t in net.state_dict().values()])


@pytest.mark.parametrize("keys", [
    {},                                                              # FedAvg, plain SGD
    {"train.momentum": 0.9, "train.weight_decay": 1e-4, "train.prox_mu": 0.01},  # FedProx
    {"aggregation.method": "scaffold"},                              # SCAFFOLD in the gradient
    {"aggregation.method": "scaffold", "train.momentum": 0.9},       # ... after the step
], ids=["fedavg", "fedprox-momentum", "scaffold", "scaffold-momentum"])
def test_a_python_fit_running_the_built_in_loop_gives_the_cpp_trainers_updates(
        fashion, tmp_path, keys):
    builtin = run(fashion, tmp_path, "builtin", **keys)
    BuiltInLoop.calls = []
    python = run(fashion, tmp_path, "python", client_fn=BuiltInLoop, **keys)
    # Every task went through the Python fit: 4 clients a round, rounds 1..3.
    assert sorted(r for r, _ in BuiltInLoop.calls) == [1] * 4 + [2] * 4 + [3] * 4
    a, b = updates(builtin), updates(python)
    assert len(a) == len(b) == 12
    for ra, rb in zip(a, b):
        assert ra[:6] == rb[:6]  # round, client, status, samples, steps, weight
        assert rb[6] == pytest.approx(ra[6], rel=1e-4)   # the client's mean training loss
    ra, rb = builtin.rounds(), python.rounds()
    assert list(rb["test_loss"]) == pytest.approx(list(ra["test_loss"]), rel=1e-4)
    # Float tolerance: the C++ trainer computes the MLP's gradients by hand (another summation
    # order than autograd's), and momentum carries the rounding from step to step.
    diff = (flat(builtin.model("last")) - flat(python.model("last"))).abs().max()
    assert diff <= 1e-4, diff
    assert ra["test_accuracy"].iloc[-1] > ra["test_accuracy"].iloc[0] + 0.2


class Seeded(fedfleet.Client):
    """A loop of its own (Adam, its own shuffling from task.seed, dropout), deterministic given
    the task."""

    def __init__(self, k):
        torch.manual_seed(0)  # every client starts alike; fit loads the task's weights anyway
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 200),
                                       torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                       torch.nn.Linear(200, 200), torch.nn.ReLU(),
                                       torch.nn.Linear(200, 10))
        names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"]
        self.names = dict(zip(names, [p for p in self.net.parameters()]))

    def fit(self, weights, task):
        with torch.no_grad():
            for name, p in self.names.items():
                p.copy_(weights[name])
        g = torch.Generator().manual_seed(task.seed)
        x, y = task.data
        opt = torch.optim.Adam(self.net.parameters(), lr=1e-3)
        for _ in range(task.epochs):
            for idx in torch.randperm(len(y), generator=g).split(task.batch_size):
                opt.zero_grad()
                with torch.random.fork_rng():
                    torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=g)))
                    F.cross_entropy(self.net(x[idx]), y[idx]).backward()
                opt.step()
        return fedfleet.FitResult(weights={n: p.detach() for n, p in self.names.items()},
                                  samples=len(y))


def test_the_same_seed_gives_the_same_history_with_a_clients_own_loop(fashion, tmp_path):
    # One worker: dropout draws from PyTorch's global generator, which the workers' threads
    # would share (the BuiltInLoop test above runs two workers: its fit draws nothing).
    one = run(fashion, tmp_path, "one", client_fn=Seeded, **{"sim.workers": 1})
    two = run(fashion, tmp_path, "two", client_fn=Seeded, **{"sim.workers": 1})
    assert history_digest(one.path, one.run_id) == history_digest(two.path, two.run_id)
    r = one.rounds()
    assert r["test_accuracy"].iloc[-1] > r["test_accuracy"].iloc[0] + 0.2


class Failing(fedfleet.Client):
    def __init__(self, k):
        self.k = k

    def fit(self, weights, task):
        if self.k in (0, 2):
            raise RuntimeError(f"client {self.k} has no GPU")
        return fedfleet.FitResult(delta={n: torch.zeros_like(w) for n, w in weights.items()},
                                  samples=len(task.data[1]), steps=1)


def test_a_fit_that_raises_is_that_clients_error_and_the_round_goes_on(fashion, tmp_path):
    r = run(fashion, tmp_path, "failing", client_fn=Failing)
    rows = updates(r)
    con = sqlite3.connect(r.path)
    events = con.execute("SELECT client_id, detail FROM events WHERE run_id = ?",
                         (r.run_id,)).fetchall()
    completed = [row for row in rows if row[2] == "completed"]
    failed = [row for row in rows if row[2] != "completed"]
    assert completed and failed
    for row in failed:  # clients 0 and 2, each with its exception's text
        assert int(row[1][1:]) in (0, 2)
        assert any(c == row[1] and f"client {int(row[1][1:])} has no GPU" in (d or "")
                   for c, d in events), events
    for row in completed:
        assert int(row[1][1:]) not in (0, 2)
    assert list(r.rounds()["status"])[1:] == ["ok"] * 3


def test_client_fn_is_refused_where_it_cannot_run(fashion, tmp_path):
    with pytest.raises(fedfleet.ConfigError, match="decentralised"):
        run(fashion, tmp_path, "peers", client_fn=BuiltInLoop, **{"policy.mode": "decentralized"})
