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


class PerClient(strategies.FedAvg):
    """configure_fit: the first client of each round trains one step; the second, with lr 0."""

    def __init__(self, bad_round=None):
        super().__init__()
        self.asked = {}
        self.bad_round = bad_round

    def configure_fit(self, round, clients):
        self.asked[round] = list(clients)
        if round == self.bad_round:
            return {clients[0]: {"learning_rate": 0.1}}
        return {clients[0]: {"max_steps": 1}, clients[1]: {"epochs": 2, "lr": 0.05}}


def test_configure_fit_sets_each_clients_task(data, tmp_path):
    s = PerClient()
    run = simulate(data, tmp_path, "configured", strategy=s)
    con = sqlite3.connect(run.path)
    # 2000 samples over 20 clients: 100 each, 7 batches of 16 a pass.
    for rnd in (1, 2, 3, 4):
        steps = dict(con.execute("SELECT client_id, steps FROM updates WHERE round = ?",
                                 (rnd,)).fetchall())
        assert sorted(steps) == sorted(s.asked[rnd])
        first, second, *rest = s.asked[rnd]
        assert steps[first] == 1
        assert steps[second] == 14
        assert all(steps[c] == 7 for c in rest), steps
    assert list(rounds_of(run)["status"]) == ["initial"] + ["ok"] * 4


def test_a_bad_setting_fails_its_round_with_the_reason(data, tmp_path):
    run = simulate(data, tmp_path, "badsetting", strategy=PerClient(bad_round=2))
    assert list(rounds_of(run)["status"]) == ["initial", "ok", "failed", "ok", "ok"]
    con = sqlite3.connect(run.path)
    details = " ".join(d for (d,) in con.execute("SELECT detail FROM events"))
    assert "unknown setting 'learning_rate'" in details, details


class WorstCase(strategies.FedAvg):
    """aggregate_evaluate: the worst client's loss and accuracy, not the weighted mean."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def aggregate_evaluate(self, round, results):
        self.seen[round] = results
        if round == 3:
            raise RuntimeError("no evaluation in round 3")
        return (max(r.loss for r in results),
                {"accuracy": min(r.accuracy for r in results), "clients": len(results)})


def test_aggregate_evaluate_records_the_strategys_federated_evaluation(data, tmp_path):
    s = WorstCase()
    run = simulate(data, tmp_path, "fedeval", strategy=s,
                   **{"coordinator.fed_eval_every": 1})
    con = sqlite3.connect(run.path)
    rows = {r: (loss, acc, metrics) for r, loss, acc, metrics in con.execute(
        "SELECT round, fed_eval_loss, fed_eval_accuracy, fed_eval_metrics FROM rounds "
        "WHERE round > 0")}
    for rnd in (1, 2, 4):
        reports = con.execute("SELECT client_id, eval_samples, eval_loss, eval_accuracy FROM "
                              "updates WHERE round = ? AND status = 'completed' AND "
                              "eval_samples > 0 ORDER BY client_id", (rnd,)).fetchall()
        assert sorted((r.client, r.samples) for r in s.seen[rnd]) == [(c, n) for c, n, _, _ in
                                                                      reports]
        loss, acc, metrics = rows[rnd]
        assert loss == pytest.approx(max(r[2] for r in reports), rel=1e-9)
        assert acc == pytest.approx(min(r[3] for r in reports), rel=1e-9)
        assert "clients" in metrics and str(len(reports)) in metrics, metrics
    # Round 3's exception: an event, and the engine's weighted means stay.
    reports = con.execute("SELECT eval_samples, eval_loss FROM updates WHERE round = 3 AND "
                          "status = 'completed' AND eval_samples > 0").fetchall()
    mean = sum(n * l for n, l in reports) / sum(n for n, _ in reports)
    assert rows[3][0] == pytest.approx(mean, rel=1e-9)
    details = " ".join(d for (d,) in con.execute("SELECT detail FROM events"))
    assert "no evaluation in round 3" in details, details
    assert list(rounds_of(run)["status"]) == ["initial"] + ["ok"] * 4


SECURE = {"secagg.mode": "secagg_plus",
          "coordinator.min_clients": 2}


class SeesOnlyTheSum(strategies.FedAvg):
    def __init__(self):
        super().__init__()
        self.seen = []

    def accumulate(self, update):
        self.seen.append((update.client, update.samples, update.weight))
        super().accumulate(update)


def test_under_secure_aggregation_a_strategy_gets_only_the_unmasked_sum(data, tmp_path):
    builtin = simulate(data, tmp_path, "secure", **SECURE)
    s = SeesOnlyTheSum()
    python = simulate(data, tmp_path, "secure-py", strategy=s, **SECURE)
    a, b = rounds_of(builtin), rounds_of(python)
    assert list(b["status"]) == list(a["status"]) == ["initial"] + ["ok"] * 4
    # One update a round, the sum's, never a client's.
    assert [c for c, _, _ in s.seen] == ["(secure sum)"] * 4
    assert [n for _, n, _ in s.seen] == list(b["completed"])[1:]
    assert list(b["test_loss"]) == pytest.approx(list(a["test_loss"]), rel=1e-5)
    assert torch.allclose(params(builtin.model("last")), params(python.model("last")),
                          atol=1e-6)
