"""fedfleet.keygen and fedfleet.serve: the coordinator service in this process, with clients
that are `fedfleet client` processes over CURVE."""
import os
import sqlite3
import stat
import subprocess

import pytest
import torch

import fedfleet
from conftest import BnNet


def test_keygen_writes_the_pairs_and_the_allow_list(tmp_path):
    keys = fedfleet.keygen(tmp_path / "k", clients=2, names=["edge-a"])
    assert sorted(keys) == ["client-1", "client-2", "coordinator", "edge-a"]
    for name, public in keys.items():
        assert os.path.isfile(public)
        secret = public + "_secret"
        assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path / "k" / "clients")) == [
        "client-1.key", "client-2.key", "edge-a.key"]
    # Existing keys are not overwritten without force.
    try:
        fedfleet.keygen(tmp_path / "k", clients=1)
        raised = None
    except fedfleet.Error as e:
        raised = str(e)
    assert raised and "exist" in raised


def test_serve_coordinates_command_line_clients_and_records_the_run(tmp_path, data,
                                                                     fedfleet_bin):
    (x, y), (xt, yt) = data
    keys = tmp_path / "keys"
    fedfleet.keygen(keys, clients=2)
    for i in (1, 2):
        part = slice((i - 1) * 1000, i * 1000)
        torch.save({"x": x[part], "y": y[part]}, tmp_path / f"mine-{i}.pt")
    cfg = fedfleet.Config(**{"run.rounds": 2, "coordinator.clients_per_round": 2,
                             "coordinator.wait_clients_s": 60, "data.partition": "none",
                             "data.num_classes": 4, "train.lr": 0.1, "run.name": "served"})
    torch.manual_seed(0)
    seen = []

    class Watching(fedfleet.strategy.FedAvg):
        """FedAvg that notes each update: the strategy runs on the service's thread."""

        def accumulate(self, update):
            seen.append(update.client)
            super().accumulate(update)

    with fedfleet.serve(cfg, model=BnNet(), test=(xt, yt), keys=keys, db=tmp_path / "s.db",
                        bind="tcp://127.0.0.1:*", wait=False, progress=False,
                        strategy=Watching()) as server:
        assert server.endpoint.startswith("tcp://127.0.0.1:")
        client_cfg = server.config.copy()
        client_cfg.save(tmp_path / "client.toml")
        clients = [subprocess.Popen(
            [fedfleet_bin, "client", "--config", str(tmp_path / "client.toml"),
             "--id", f"client-{i}", "--keys", str(keys), "--coordinator", server.endpoint,
             "--set", f"data.path={tmp_path}/mine-{i}.pt", "--set", 'data.test_path=""'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in (1, 2)]
        run = server.wait(timeout=240)
        outs = [c.communicate(timeout=60) for c in clients]
    assert run is not None, [o[1] for o in outs]
    for c, (_, err) in zip(clients, outs):
        assert c.returncode == 0, err
    rounds = run.rounds()
    assert list(rounds["round"]) == [0, 1, 2]
    assert list(rounds["completed"]) == [0, 2, 2]
    con = sqlite3.connect(run.path)
    clients_seen = {c for (c,) in con.execute(
        "SELECT DISTINCT client_id FROM updates WHERE run_id = ?", (run.run_id,))}
    assert len(clients_seen) == 2
    # The strategy aggregated every round: each client's update, by its key's name.
    assert sorted(seen) == ["client-1", "client-1", "client-2", "client-2"]
    assert run.config()["aggregation.method"] == "custom"
    # The served model comes back trained.
    net = run.model("last")
    net.eval()
    with torch.no_grad():
        acc = (net(xt).argmax(1) == yt).double().mean().item()
    assert acc == pytest.approx(rounds["test_accuracy"].iloc[-1], abs=1e-4)
