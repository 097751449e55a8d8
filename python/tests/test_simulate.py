"""fedfleet.simulate: a user's own nn.Module and tensors, the model back, the same history as
the command, Ctrl-C and resume."""
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import numpy
import pytest
import torch
from torch import nn

import fedfleet
from conftest import BnNet, blobs, history_digest, run_cli, small_config


def accuracy(net, x, y):
    net.eval()
    with torch.no_grad():
        return (net(x).argmax(1) == y).double().mean().item()


def test_a_module_with_batchnorm_learns_and_comes_back_as_the_history_says(data):
    (x, y), (xt, yt) = data
    torch.manual_seed(0)
    run = fedfleet.simulate(small_config(fedfleet), model=BnNet(), train=(x, y), test=(xt, yt),
                            progress=False)
    rounds = run.rounds()
    assert list(rounds["round"]) == [0, 1, 2, 3, 4]
    first, last = rounds["test_accuracy"].iloc[0], rounds["test_accuracy"].iloc[-1]
    assert last > first + 0.2, rounds[["round", "test_accuracy"]]
    assert last > 0.8
    # The checkpoint as a module evaluated in plain PyTorch gives the recorded accuracy (to
    # 0.01 points: a fraction within 1e-4).
    net = run.model("last")
    assert isinstance(net, torch.jit.ScriptModule)
    assert accuracy(net, xt, yt) == pytest.approx(last, abs=1e-4)
    best_round = int(rounds.loc[rounds["test_accuracy"].idxmax(), "round"])
    best = run.model("best")
    assert accuracy(best, xt, yt) == pytest.approx(rounds["test_accuracy"].max(), abs=1e-4)
    two = run.model(round=2)
    assert accuracy(two, xt, yt) == pytest.approx(rounds["test_accuracy"].iloc[2], abs=1e-4)
    assert best_round in set(rounds["round"])
    # BatchNorm's running statistics were federated: not the initial ones any more.
    assert not torch.allclose(net.bn.running_mean, torch.zeros(32))


def test_a_dataset_is_materialised_and_bounded(data, tmp_path):
    (x, y), (xt, yt) = data
    train = torch.utils.data.TensorDataset(x, y)
    run = fedfleet.simulate(small_config(fedfleet, **{"run.rounds": 1}), model=BnNet(),
                            train=train, test=(xt, yt), db=tmp_path / "d.db", progress=False)
    assert len(run.rounds()) == 2
    with pytest.raises(fedfleet.ConfigError, match=r"GiB in memory, more than"):
        fedfleet.simulate(small_config(fedfleet), model=BnNet(), train=train, test=(xt, yt),
                          db=tmp_path / "e.db", progress=False, max_dataset_bytes=1000)


def test_the_same_configuration_from_the_command_and_from_python_gives_one_history(
        data, tmp_path, fedfleet_bin):
    (x, y), (xt, yt) = data
    run = fedfleet.simulate(small_config(fedfleet), model=BnNet(), train=(x, y), test=(xt, yt),
                            db=tmp_path / "py.db", progress=False)
    # The run's configuration as it was stored names the scripted model and the data files.
    stored = run.config()
    assert stored["model.name"] == "torchscript"
    assert os.path.isfile(stored["model.path"]) and os.path.isfile(stored["data.path"])
    stored.save(tmp_path / "run.toml")
    run_cli(fedfleet_bin, "sim", "--config", str(tmp_path / "run.toml"),
            "--db", str(tmp_path / "cli.db"), "--progress", "off")
    py = history_digest(run.path, run.run_id)
    cli = history_digest(str(tmp_path / "cli.db"), 1)
    assert py["rounds"][0] == 5 and py["updates"][0] >= 20
    assert py == cli


def test_a_module_torchscript_cannot_compile_is_named_with_the_construct(data):
    class Unscriptable(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x, **options):
            return self.fc(x)

    (x, y), (xt, yt) = data
    with pytest.raises(fedfleet.ModelError) as e:
        fedfleet.simulate(small_config(fedfleet), model=Unscriptable(), train=(x, y),
                          test=(xt, yt), progress=False)
    message = str(e.value)
    assert "TorchScript cannot compile Unscriptable" in message
    assert "def forward(self, x, **options):" in message, message
    assert "variable number of arguments" in message, message
    assert "Fix:" in message

    class NumpyInForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            return self.fc(torch.from_numpy(numpy.tanh(x.numpy())))

    # TorchScript's own message has no source line here: the method is named instead.
    with pytest.raises(fedfleet.ModelError,
                       match=r"numpy(.|\n)*while compiling NumpyInForward\.forward, .*test_simulate"):
        fedfleet.simulate(small_config(fedfleet), model=NumpyInForward(), train=(x, y),
                          test=(xt, yt), progress=False)


INTERRUPTED = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    import fedfleet
    from conftest import BnNet, blobs, small_config
    torch.manual_seed(0)
    cfg = small_config(fedfleet, **{"run.rounds": 40, "sim.clients": 40,
                                    "coordinator.clients_per_round": 10})
    fedfleet.simulate(cfg, model=BnNet(), train=blobs(20000, 1), test=blobs(500, 2),
                      db=sys.argv[1], progress="plain", resume=len(sys.argv) > 3)
    print("finished")
""")


def interrupt_at(script, db, here, round_no, *more):
    """Runs the script, sends SIGINT once it reports round `round_no`; (exit code, stdout,
    stderr)."""
    p = subprocess.Popen([sys.executable, str(script), db, here, *more], stderr=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    seen = []
    deadline = time.monotonic() + 240
    for line in p.stderr:
        seen.append(line)
        if f"round {round_no}/40" in line or time.monotonic() > deadline:
            break
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    return p.returncode, out, "".join(seen) + err


def committed_rounds(db):
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rounds = [r for (r,) in con.execute("SELECT round FROM rounds ORDER BY round")]
    con.close()
    return rounds


def test_sigint_stops_cleanly_and_the_history_resumes(tmp_path, fedfleet_bin):
    db = str(tmp_path / "int.db")
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED)
    here = os.path.dirname(__file__)
    # Interrupted once two rounds are committed: KeyboardInterrupt, a sound history.
    rc, out, err = interrupt_at(script, db, here, 2)
    assert rc != 0
    assert "KeyboardInterrupt" in err, err
    assert "finished" not in out
    first = committed_rounds(db)
    assert 3 <= len(first) < 41 and first == list(range(len(first))), first
    # Resumed from Python (resume=True), and interrupted again further on.
    rc, out, err = interrupt_at(script, db, here, len(first) + 2, "resume")
    assert rc != 0 and "KeyboardInterrupt" in err, err
    second = committed_rounds(db)
    assert len(first) < len(second) < 41 and second == list(range(len(second))), second
    # The command's --resume finishes it: one run of rounds 0..40.
    p = run_cli(fedfleet_bin, "sim", "--db", db, "--resume", "--progress", "off", timeout=600)
    assert "history:" in p.stdout
    assert committed_rounds(db) == list(range(41))
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 1
    con.close()


def test_a_decentralised_run_returns_its_peers(tmp_path):
    cfg = fedfleet.Config(**{"policy.mode": "decentralized", "decentralized.algorithm": "dpsgd",
                             "decentralized.peers": 4, "decentralized.iterations": 20,
                             "data.format": "synthetic", "model.name": "logreg",
                             "run.name": "peers"})
    run = fedfleet.simulate(cfg, db=tmp_path / "p.db", progress=False)
    assert run.summary["peers"] == 4
    assert run.summary["iterations"] >= 4 * 20
    peers = run.peers()
    assert len(peers) == 4
    con = sqlite3.connect(run.path)
    stored = con.execute("SELECT COUNT(DISTINCT peer) FROM peer_iterations WHERE run_id = ?",
                         (run.run_id,)).fetchone()[0]
    assert stored == 4


def test_the_engine_stays_quiet_unless_asked_run_after_run(capfd, tmp_path):
    cfg = fedfleet.Config(**{"data.format": "synthetic", "model.name": "logreg",
                             "sim.clients": 20, "coordinator.clients_per_round": 4,
                             "run.rounds": 2})
    for i in range(2):
        fedfleet.simulate(cfg, db=tmp_path / f"q{i}.db", progress=False)
    err = capfd.readouterr().err
    assert " info " not in err, err
    fedfleet.set_log_level("info")
    try:
        fedfleet.simulate(cfg, db=tmp_path / "loud.db", progress=False)
    finally:
        fedfleet.set_log_level("warn")
    assert " info round   2 ok" in capfd.readouterr().err
