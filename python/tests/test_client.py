"""fedfleet.Client and run_client: three Python client processes with their own training loop,
over CURVE, against the command's coordinator; a fit that raises and a client killed mid-round."""
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import fedfleet
from conftest import BnNet, blobs

CLIENT = textwrap.dedent("""
    import sys, time, torch
    from torch import nn
    sys.path.insert(0, sys.argv[6])
    import fedfleet
    from conftest import blobs
    name, keys, endpoint, model_path, mode = sys.argv[1:6]
    i = int(name.split("-")[1])
    x, y = blobs(2100, 1)
    x, y = x[(i - 1) * 700:i * 700], y[(i - 1) * 700:i * 700]
    xe, ye = blobs(100 * i, 10 + i)  # held-out: 100, 200 and 300 samples
    net = torch.jit.load(model_path)

    class Loop(fedfleet.Client):
        def evaluate(self, weights, task):
            net.load_state_dict(weights, strict=False)
            net.eval()
            with torch.no_grad():
                logits = net(xe)
            loss = nn.functional.cross_entropy(logits, ye).item()
            correct = (logits.argmax(1) == ye).float().mean().item()
            print(f"{name} evaluated round {task.round}: {loss!r}", flush=True)
            return fedfleet.EvalResult(loss=loss, samples=len(ye), accuracy=correct,
                                       metrics={"margin": 1.5})

        # A loop of its own: AdamW, its own shuffling, FedProx's term when the task asks.
        def fit(self, weights, task):
            print(f"{name} fit round {task.round}", flush=True)
            if mode == "raise" and task.round == 2:
                raise ValueError(f"{name}: a bad batch in round 2")
            if mode == "hang" and task.round == 3:
                time.sleep(600)
            net.load_state_dict(weights, strict=False)
            net.train()
            if mode == "scaffold":  # SGD with SCAFFOLD's correction through task.step
                opt = torch.optim.SGD(net.parameters(), lr=task.lr)
                steps = 0
                for idx in task.batches(len(y)):
                    opt.zero_grad()
                    nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
                    task.step(opt, net)
                    steps += 1
                size = float(sum(v.abs().sum() for v in task.scaffold_shift.values()))
                print(f"{name} shift {len(task.scaffold_shift)} round {task.round} size {size!r}",
                      flush=True)
                return fedfleet.FitResult(weights=net.state_dict(), samples=len(y), steps=steps)
            opt = torch.optim.AdamW(net.parameters(), lr=task.lr)
            g = torch.Generator().manual_seed(task.seed + i)
            losses = []
            for _ in range(task.epochs):
                order = torch.randperm(len(y), generator=g)
                for b in range(0, len(y), task.batch_size):
                    idx = order[b:b + task.batch_size]
                    opt.zero_grad()
                    loss = nn.functional.cross_entropy(net(x[idx]), y[idx]) + task.prox(net)
                    loss.backward()
                    opt.step()
                    losses.append(loss.item())
            return fedfleet.FitResult(weights=net.state_dict(), samples=len(y),
                                      steps=len(losses), loss=sum(losses) / len(losses))

    fedfleet.run_client(Loop(), coordinator=endpoint, keys=keys, id=name, model_path=model_path)
    print(f"{name} served", flush=True)
""")


def start(tmp_path, fedfleet_bin, modes, more=""):
    """The command's coordinator (3 rounds, the clients of `modes` a round) and one Python
    client process per entry of modes {name: mode}: (coordinator, client processes, db)."""
    keys = tmp_path / "keys"
    fedfleet.keygen(keys, clients=len(modes))
    torch.manual_seed(0)
    model_path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(BnNet()), model_path)
    xt, yt = blobs(500, 2)
    torch.save({"x": xt, "y": yt}, tmp_path / "test.pt")
    (tmp_path / "job.toml").write_text(textwrap.dedent(f"""
        [run]
        name = "python-clients"
        rounds = 3
        [coordinator]
        clients_per_round = {len(modes)}
        min_clients = {len(modes)}
        quorum = 2
        wait_clients_s = 90
        deadline_s = 90
        liveness_s = 3
        fed_eval_every = 1
        [model]
        name = "torchscript"
        path = "{model_path}"
        [data]
        format = "tensors"
        partition = "none"
        test_path = "{tmp_path}/test.pt"
        num_classes = 4
        [train]
        epochs = 1
        batch = 32
        lr = 0.01
    """) + textwrap.dedent(more))
    db = tmp_path / "c.db"
    endpoint_file = tmp_path / "endpoint"
    coord = subprocess.Popen(
        [fedfleet_bin, "coordinator", "--config", str(tmp_path / "job.toml"), "--db", str(db),
         "--keys", str(keys), "--bind", "tcp://127.0.0.1:*", "--endpoint-file",
         str(endpoint_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    clients = []
    try:
        deadline = time.monotonic() + 60
        while not endpoint_file.exists() and time.monotonic() < deadline:
            assert coord.poll() is None, coord.communicate()[1]
            time.sleep(0.1)
        endpoint = endpoint_file.read_text().strip()
        script = tmp_path / "client.py"
        script.write_text(CLIENT)
        here = os.path.dirname(__file__)
        for name, mode in modes.items():
            clients.append(subprocess.Popen(
                [sys.executable, str(script), name, str(keys), endpoint, str(model_path), mode,
                 here], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    except BaseException:
        for p in [coord, *clients]:
            p.kill()
        raise
    return coord, clients, db


def test_python_clients_train_with_their_own_loop_over_curve(tmp_path, fedfleet_bin):
    coord, clients, db = start(tmp_path, fedfleet_bin,
                               {"client-1": "plain", "client-2": "hang", "client-3": "raise"})
    try:
        # client-2 is killed once it is inside round 3's fit.
        hang = clients[1]
        deadline = time.monotonic() + 180
        for line in hang.stdout:
            if "fit round 3" in line or time.monotonic() > deadline:
                break
        hang.send_signal(signal.SIGKILL)
        hang.wait(timeout=30)
        out, err = coord.communicate(timeout=240)
        assert coord.returncode == 0, err
        others = [c.communicate(timeout=60)[0] for c in (clients[0], clients[2])]
    finally:
        for p in [coord, *clients]:
            if p.poll() is None:
                p.kill()
    for c, text in zip((clients[0], clients[2]), others):
        assert c.returncode == 0, text
        assert "served" in text, text
    con = sqlite3.connect(db)
    rounds = con.execute("SELECT round, status, completed, test_accuracy FROM rounds "
                         "ORDER BY round").fetchall()
    assert [r[0] for r in rounds] == [0, 1, 2, 3]
    assert [r[1] for r in rounds] == ["initial", "ok", "ok", "ok"]
    assert rounds[1][2] == 3
    assert rounds[2][2] == 2 and rounds[3][2] == 2
    assert rounds[3][3] > rounds[0][3] + 0.2, rounds
    updates = {(r, c): s for r, c, s in con.execute(
        "SELECT round, client_id, status FROM updates")}
    events = con.execute("SELECT kind, client_id, detail FROM events").fetchall()
    # The fit that raised: that client's error, with the exception's text.
    assert updates[(2, "client-3")] != "completed", updates
    assert any(c == "client-3" and "a bad batch in round 2" in (d or "")
               for _, c, d in events), events
    # The killed client: dropped in round 3, which completed with the other two.
    assert updates[(3, "client-2")] == "dropped", updates
    assert updates[(3, "client-1")] == "completed"
    assert updates[(3, "client-3")] == "completed"
    # evaluate(): each completed update carries the client's own evaluation, as it computed it;
    # the round's federated evaluation is their samples-weighted mean.
    said = {}
    for line in others[0].splitlines():
        if line.startswith("client-1 evaluated round "):
            rnd, loss = line[len("client-1 evaluated round "):].split(": ")
            said[int(rnd)] = float(loss)
    assert sorted(said) == [1, 2, 3], others[0]
    for rnd in (1, 2, 3):
        rows = con.execute("SELECT client_id, eval_samples, eval_loss, eval_metrics FROM updates "
                           "WHERE round = ? AND status = 'completed'", (rnd,)).fetchall()
        for client, n, loss, metrics in rows:
            assert n == 100 * int(client.split("-")[1]), rows
            assert "margin" in metrics, metrics
        by_client = {c: (n, loss) for c, n, loss, _ in rows}
        assert by_client["client-1"][1] == said[rnd]
        fed = con.execute("SELECT fed_eval_loss, fed_eval_samples FROM rounds WHERE round = ?",
                          (rnd,)).fetchone()
        assert fed[1] == sum(n for n, _ in by_client.values())
        assert fed[0] == pytest.approx(sum(n * l for n, l in by_client.values()) / fed[1])


def test_a_python_client_honours_scaffold_over_curve(tmp_path, fedfleet_bin):
    # aggregation.method = "scaffold": each task carries c, the runtime keeps c_k and uploads
    # the control delta it computes from the steps fit reports (2P values, which the coordinator
    # refuses for any other length).
    coord, clients, db = start(tmp_path, fedfleet_bin,
                               {"client-1": "scaffold", "client-2": "scaffold"},
                               '[aggregation]\nmethod = "scaffold"\n')
    try:
        out, err = coord.communicate(timeout=240)
        assert coord.returncode == 0, err
        texts = [c.communicate(timeout=60)[0] for c in clients]
    finally:
        for p in [coord, *clients]:
            if p.poll() is None:
                p.kill()
    for c, text in zip(clients, texts):
        assert c.returncode == 0, text
        # Every task carried c - c_k for each tensor of the layout: 6 parameters and the
        # BatchNorm's 2 float buffers.
        assert all(f"shift 8 round {r} size" in text for r in (1, 2, 3)), text
        # c and c_k start at 0; from round 2 on, c - c_k moves: the control variates flow.
        sizes = {int(line.split()[4]): float(line.split()[6]) for line in text.splitlines()
                 if " shift " in line}
        assert sizes[1] == 0 and sizes[2] > 0 and sizes[3] > 0, sizes
    con = sqlite3.connect(db)
    rounds = con.execute("SELECT round, status, completed, test_accuracy FROM rounds "
                         "ORDER BY round").fetchall()
    assert [r[1] for r in rounds] == ["initial", "ok", "ok", "ok"], rounds
    assert all(r[2] == 2 for r in rounds[1:]), rounds
    assert rounds[3][3] > rounds[0][3] + 0.2, rounds
