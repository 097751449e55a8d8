"""fedfleet.Strategy: a Python aggregation rule as the engine's aggregator."""
import sqlite3

import pytest
import torch

import fedfleet
from fedfleet import strategy as strategies
from conftest import BnNet, run_cli, small_config


def rounds_of(run):
    return run.rounds().set_index("round")


def params(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def simulate(data, tmp_path, name, **more):
    (x, y), (xt, yt) = data
    torch.manual_seed(0)
    cfg = small_config(fedfleet, **{"run.rounds": 4, "aggregation.trim_fraction": 0.2})
    return fedfleet.simulate(cfg, model=BnNet(), train=(x, y), test=(xt, yt),
                             db=tmp_path / f"{name}.db", progress=False, **more)


def test_a_python_trimmed_mean_gives_the_built_in_trimmed_means_history(data, tmp_path):
    builtin = simulate(data, tmp_path, "builtin", **{"aggregation.method": "trimmed_mean"})
    python = simulate(data, tmp_path, "python", strategy=strategies.TrimmedMean(beta=0.2))
    assert python.config()["aggregation.method"] == "custom"
    a, b = rounds_of(builtin), rounds_of(python)
    assert list(a.index) == list(b.index) == [0, 1, 2, 3, 4]
    assert list(a["status"]) == list(b["status"]) == ["initial", "ok", "ok", "ok", "ok"]
    assert list(a["completed"]) == list(b["completed"])
    # The same clients each round (the same seed, the same sampling).
    con_a, con_b = sqlite3.connect(builtin.path), sqlite3.connect(python.path)
    q = "SELECT round, client_id, status FROM updates ORDER BY round, client_id"
    assert con_a.execute(q).fetchall() == con_b.execute(q).fetchall()
    # To float tolerance: the means are summed in another order.
    for col in ("test_loss", "train_loss"):
        assert list(b[col]) == pytest.approx(list(a[col]), rel=1e-5, abs=1e-6), col
    assert (a["test_accuracy"] - b["test_accuracy"]).abs().max() <= 2 / 500
    assert torch.allclose(params(builtin.model("last")), params(python.model("last")),
                          atol=1e-5)


class Recording(strategies.Strategy):
    """Keeps what it was given, averages unweighted, and fails round 2."""

    def __init__(self):
        self.seen = {}

    def aggregate_fit(self, round, results):
        self.seen[round] = sorted((r.client, r.samples, r.steps) for r in results)
        if round == 2:
            raise ValueError("boom in round 2")
        return torch.stack([r.delta for r in results]).mean(dim=0)


def test_a_strategy_sees_the_accepted_updates_and_an_exception_fails_only_its_round(
        data, tmp_path):
    rec = Recording()
    run = simulate(data, tmp_path, "rec", strategy=rec)
    r = rounds_of(run)
    assert list(r["status"]) == ["initial", "ok", "failed", "ok", "ok"]
    # The failed round left the model as it was (its version did not move; a failed round is
    # not evaluated) and the next round went on from it.
    assert r.loc[2, "model_version"] == r.loc[1, "model_version"]
    assert r.loc[3, "model_version"] == r.loc[1, "model_version"] + 1
    assert r.loc[4, "test_accuracy"] > r.loc[0, "test_accuracy"]
    # What the strategy saw is what the history says completed, with the claimed samples.
    con = sqlite3.connect(run.path)
    for rnd in (1, 3, 4):
        stored = con.execute(
            "SELECT client_id, n_samples FROM updates WHERE round = ? AND status = 'completed' "
            "ORDER BY client_id", (rnd,)).fetchall()
        assert [(c, s) for c, s, _ in rec.seen[rnd]] == [(c, float(s)) for c, s in stored]
        assert all(steps > 0 for _, _, steps in rec.seen[rnd])
    # The exception is recorded with its text.
    details = " ".join(d for (d,) in con.execute("SELECT detail FROM events"))
    assert "boom in round 2" in details, details


def test_a_streaming_strategy_gets_each_update_as_it_completes(data, tmp_path):
    builtin = simulate(data, tmp_path, "fedavg", **{"aggregation.method": "fedavg"})
    streamed = strategies.FedAvg()
    calls = []
    original = streamed.accumulate

    def accumulate(update):
        calls.append(update.client)
        original(update)

    streamed.accumulate = accumulate
    python = simulate(data, tmp_path, "stream", strategy=streamed)
    assert len(calls) == int(rounds_of(python)["completed"].sum())
    a, b = rounds_of(builtin), rounds_of(python)
    assert list(b["test_loss"]) == pytest.approx(list(a["test_loss"]), rel=1e-4)


def test_a_wrong_sized_result_fails_the_round_with_a_message(data, tmp_path):
    class ShortInRound2(strategies.Strategy):
        def aggregate_fit(self, round, results):
            if round == 2:
                return torch.zeros(3)
            return torch.stack([r.delta for r in results]).mean(dim=0)

    run = simulate(data, tmp_path, "short", strategy=ShortInRound2(), **{"run.rounds": 3})
    assert list(rounds_of(run)["status"]) == ["initial", "ok", "failed", "ok"]
    con = sqlite3.connect(run.path)
    details = " ".join(d for (d,) in con.execute("SELECT detail FROM events"))
    assert "returned 3 values for a model of" in details, details


def test_the_command_refuses_a_custom_method_without_a_strategy(fedfleet_bin, tmp_path):
    p = run_cli(fedfleet_bin, "sim", "--set", "data.format=synthetic", "--set",
                "aggregation.method=custom", "--db", str(tmp_path / "c.db"), check=False)
    assert p.returncode == 2
    assert "strategy given from Python" in p.stderr, p.stderr
