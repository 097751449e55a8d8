#!/usr/bin/env bash
# The price of training in Python: the same simulated rounds of the built-in CNN on
# Fashion-MNIST (CLIENTS clients with 600 samples each, 10 a round, one epoch of batch-32 SGD,
# two workers), trained once by the C++ trainer and once by a fedfleet.Client whose fit runs the
# trainer's loop in PyTorch (fedfleet.simulate(client_fn=...): the same batches through
# task.batches, torch.optim.SGD), alternately, REPEATS times each, in one Python process. Each
# time is fedfleet.simulate's wall time divided by its rounds. The two runs must agree (every
# round's test accuracy within 1 point and test loss within 1%), or the benchmark fails: they
# would not be the same training. RESULT keys:
#   cpp_s    median seconds per round, C++ trainer
#   py_s     median seconds per round, Python fit
#   ratio    py_s / cpp_s (goal <= 1.3: the time belongs in the kernels, not in Python)
# Environment: BUILD_DIR (default build), ROUNDS (default 3), REPEATS (default 3), CLIENTS
# (default 100).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_python_package
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

PYTHONPATH="$BUILD_DIR/python" /usr/bin/python3 - "$OUT" "${ROUNDS:-3}" "${REPEATS:-3}" \
  "${CLIENTS:-100}" <<'PY'
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import fedfleet
from fedfleet import models

out, rounds, repeats, clients = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])


class CnnLoop(fedfleet.Client):
    """The built-in trainer's loop over the built-in CNN, in PyTorch."""

    def __init__(self, k):
        self.net = models.build("cnn")

    def fit(self, weights, task):
        self.net.load_state_dict(weights)
        x, y = task.data
        opt = torch.optim.SGD(self.net.parameters(), lr=task.lr, momentum=task.momentum,
                              weight_decay=task.weight_decay)
        steps = 0
        for idx in task.batches():
            opt.zero_grad()
            F.cross_entropy(self.net(x[idx]), y[idx]).backward()
            task.step(opt, self.net)
            steps += 1
        return fedfleet.FitResult(weights=self.net.state_dict(), samples=len(y), steps=steps)


def run(name, i, client_fn):
    cfg = fedfleet.Config(**{"run.name": "python-client", "run.seed": 11, "run.rounds": rounds,
                             "model.name": "cnn", "sim.clients": clients,
                             "coordinator.clients_per_round": 10, "data.partition": "iid",
                             "train.batch": 32, "train.epochs": 1, "train.lr": 0.05,
                             "sim.workers": 2, "sim.fleet": "uniform", "sim.dropout": 0})
    t0 = time.perf_counter()
    r = fedfleet.simulate(cfg, db=f"{out}/{name}-{i}.db", progress=False, client_fn=client_fn)
    seconds = (time.perf_counter() - t0) / rounds
    return seconds, r.rounds()


cpp, py = [], []
for i in range(repeats):
    # Alternate which goes first, so that a drift in the machine's speed favours neither.
    order = [("cpp", None), ("py", CnnLoop)] if i % 2 == 0 else [("py", CnnLoop), ("cpp", None)]
    got = {}
    for name, fn in order:
        got[name] = run(name, i, fn)
    cpp.append(got["cpp"][0])
    py.append(got["py"][0])
    print(f"repeat {i + 1}: C++ {cpp[-1]:.2f} s/round, Python {py[-1]:.2f} s/round", flush=True)

a, b = got["cpp"][1], got["py"][1]
acc_gap = (a["test_accuracy"] - b["test_accuracy"]).abs().max()
loss_gap = ((a["test_loss"] - b["test_loss"]).abs() / a["test_loss"]).max()
same = len(a) == len(b) == rounds + 1 and acc_gap <= 0.01 and loss_gap <= 0.01
print(f"same training: {same} (largest gaps: accuracy {acc_gap:.4f}, test loss "
      f"{100 * loss_gap:.3f}%); final accuracy {100 * a['test_accuracy'].iloc[-1]:.2f}% (C++), "
      f"{100 * b['test_accuracy'].iloc[-1]:.2f}% (Python)")
cpp_s, py_s = statistics.median(cpp), statistics.median(py)
ratio = py_s / cpp_s
print(f"RESULT cpp_s={cpp_s:.2f} py_s={py_s:.2f} ratio={ratio:.3f}")
sys.exit(0 if same and ratio <= 1.3 else 1)
PY
