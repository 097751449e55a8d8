#!/usr/bin/python3
"""Seeded random-configuration test of the fleet simulator (`fedfleet sim`).

Draws N simulator configurations from random.Random(SEED) (the same seed always gives the
same configurations), writes each as a TOML file in a directory of its own, runs
`FEDFLEET sim --config config.toml` there, several at once, and judges how each run ended:

  completed    exit status 0
  clean_error  exit status 1 or 2, and the last non-empty stderr line starts with
               "fedfleet sim: " and does not say INTERNAL
  hang         still running at the wall-clock bound (its process group is killed)
  crash        anything else: killed by a signal, another exit status, an INTERNAL error,
               an abort / assertion / check / sanitizer report, a non-zero exit without the
               "fedfleet sim: " line, or a bad history (below)

Every history file a run leaves is checked: PRAGMA integrity_check must say ok, and each run's
round numbers in the rounds table must be contiguous from their minimum. A bad history counts
as a crash, with the reason.

The draws cover the fleet (size, uniform or mobile-mix, dropout, diurnal availability,
rejoin time, stragglers), the round policy (K, min_clients, quorum, over-selection, fixed or
percentile deadlines, sync or async FedBuff, decentralised peers), codecs, aggregation methods
and server optimisers, secure aggregation (also in combinations it refuses), differential
privacy, block-cyclic data, Fashion-MNIST subsets cut by every partition scheme (sometimes
with more clients than samples) and FedProx synthetic data. Seven draws in ten are then tamed:
the combinations the config check is known to refuse are taken out, so that most runs get to
their rounds; the others keep them, to test the refusals. Every run is small: 1-4 rounds,
logreg or mlp (rarely the CNN on tiny data), a few local steps.

Regression cases (--cases DIR): every DIR/*.toml runs too, named by its file. A comment line
`# expect: completed` or `# expect: clean_error` among its first comment lines says how it
must end; a case that ends otherwise fails the test. An optional `# expect-message: TEXT` line
also asks a clean error's message to contain TEXT.

Output: each configuration's id and a one-line summary, then one line per run (id, outcome,
wall seconds, and the message of an error), then for failures their TOML text, a line
`CASES total=T met=M unmet=U` when cases ran, and last
`RESULT configs=N completed=A clean_errors=B hangs=C crashes=D` (over the drawn configs).
Exit status 0 only when there was no hang, no crash and every case met its expectation.

Usage:
  combos.py --fedfleet BIN --seed S --count N [--jobs J] [--timeout SECONDS]
            [--work DIR] [--cases DIR] [--keep]

Options:
  --fedfleet BIN     the fedfleet program
  --seed S           seed of the draws (default 1)
  --count N          configurations to draw and run (default 50; 0: cases only)
  --jobs J           runs at once (default 2)
  --timeout SECONDS  wall-clock bound of one run; a run still going is a hang (default 60)
  --work DIR         directory for the configs and histories (default: a new temporary one)
  --cases DIR        also run the regression cases DIR/*.toml
  --keep             keep the work directory (it is removed otherwise)
"""

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

SECTIONS = ["run", "coordinator", "policy", "aggregation", "selection", "model", "data",
            "train", "sim", "decentralized", "blocks", "dp", "secagg", "history"]

# Text in stderr that means the program broke, whatever its exit status.
CRASH_PATTERNS = [
    "AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer", "ThreadSanitizer",
    ": runtime error: ", "check failed at ", "Assertion `", "terminate called",
    "*** stack smashing", "double free or corruption", "malloc(): ", "free(): ",
    "Segmentation fault", "core dumped",
]

CODECS = ["none", "fp16", "bf16", "qsgd8", "qsgd4", "topk:0.01", "topk:0.1", "sign"]
CODEC_WEIGHTS = [30, 10, 8, 10, 8, 12, 5, 5]


# ------------------------------------------------------------------------------------------
# Drawing configurations


def log_uniform_int(rng, lo, hi):
    """An integer in [lo, hi], uniform in log scale."""
    return min(hi, max(lo, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))))


def chance(rng, p):
    return rng.random() < p


def pick(rng, values, weights=None):
    return rng.choices(values, weights=weights)[0]


def rounded(x, digits=3):
    return float(round(x, digits))


def draw_fleet(rng, c, clients):
    """[sim]: the fleet, its availability, dropout, rejoin time and stragglers."""
    s = c["sim"]
    s["clients"] = clients
    s["fleet"] = pick(rng, ["uniform", "mobile-mix"])
    r = rng.random()
    if r < 0.3:
        s["dropout"] = -1.0
    elif r < 0.6:
        s["dropout"] = 0.0
    else:
        s["dropout"] = rounded(rng.uniform(0.01, 0.5))
    if chance(rng, 0.3):
        s["availability"] = "diurnal"
        s["online_hours"] = pick(rng, [0, rng.randint(1, 24)], [1, 3])
    else:
        s["availability"] = "always"
    r = rng.random()
    if r < 0.2:
        s["rejoin_s"] = 0.0
    elif r < 0.7:
        s["rejoin_s"] = rounded(rng.uniform(1, 1200), 1)
    if chance(rng, 0.3):
        s["stragglers"] = rounded(rng.uniform(0.05, 0.6))
        s["straggler_mode"] = pick(rng, ["partial", "drop"])
    if chance(rng, 0.1):
        s["coordinator_ingress_mbps"] = rounded(rng.uniform(1, 100), 1)


def draw_data(rng, c, clients, synthetic, model):
    """[data] and the model: Fashion-MNIST subsets or FedProx synthetic data."""
    d = c["data"]
    c["model"]["name"] = model
    if synthetic:
        d["format"] = "synthetic"
        d["max_samples"] = rng.randint(30, 300)
        d["eval_devices"] = rng.randint(3, 40)
        if chance(rng, 0.3):
            d["synthetic_iid"] = True
        if chance(rng, 0.2):
            d["synthetic_dim"] = rng.randint(5, 80)
        return
    d["format"] = "fashion-mnist"
    if model == "cnn":
        d["train_subset"] = rng.randint(200, 500)
        d["test_subset"] = rng.randint(100, 200)
    else:
        d["train_subset"] = rng.randint(200, 5000)
        d["test_subset"] = rng.randint(200, 1000)
    if clients * 3 > d["train_subset"] and model != "cnn" and chance(rng, 0.85):
        # A large fleet: a few samples a client still (loading more costs little).
        d["train_subset"] = min(15000, clients * rng.randint(3, 5))
    if clients > 2 and chance(rng, 0.05):
        # More clients than training samples.
        d["train_subset"] = rng.randint(max(1, clients // 3), clients - 1)
    d["partition"] = pick(rng, ["iid", "dirichlet", "labels", "shards", "quantity"],
                          [3, 3, 2, 1, 1])
    if d["train_subset"] < 20 * clients and chance(rng, 0.7):
        d["partition"] = "iid"  # label skew on a few samples a client leaves some empty
    if d["partition"] in ("dirichlet", "quantity") and chance(rng, 0.5):
        d["alpha"] = rounded(rng.uniform(0.05, 5))
    if d["partition"] == "labels" and chance(rng, 0.5):
        d["labels_per_client"] = rng.randint(1, 10)
    if d["partition"] == "shards" and chance(rng, 0.5):
        d["shards_per_client"] = rng.randint(1, 4)


def draw_train(rng, c, model):
    """[train]: a few local steps (or one epoch of a small shard)."""
    t = c["train"]
    if model == "cnn":
        t["steps"] = rng.randint(1, 2)
        t["batch"] = pick(rng, [8, 16])
    elif chance(rng, 0.7):
        t["steps"] = rng.randint(1, 5)
        t["batch"] = pick(rng, [8, 16, 32, 64])
    else:
        t["epochs"] = 1
        t["steps"] = 0
        t["batch"] = pick(rng, [16, 32, 64])
    t["lr"] = pick(rng, [0.01, 0.05, 0.1])
    r = rng.random()
    if r < 0.1:
        t["optimizer"] = pick(rng, ["adam", "adamw"])
        t["lr"] = 0.001
        if chance(rng, 0.1):
            t["momentum"] = 0.9  # refused: momentum is SGD's
    elif r < 0.3:
        t["momentum"] = 0.9
    if chance(rng, 0.15):
        t["prox_mu"] = pick(rng, [0.01, 0.1])
    if chance(rng, 0.1):
        t["weight_decay"] = 0.0001


def draw_aggregation(rng, c, allow_robust=True):
    a = c["aggregation"]
    methods = ["fedavg", "fednova", "scaffold", "median", "trimmed_mean"]
    a["method"] = pick(rng, methods, [10, 3, 3, 2, 2] if allow_robust else [10, 1, 1, 1, 1])
    a["server_optimizer"] = pick(rng, ["fedavg", "fedavgm", "fedadagrad", "fedadam", "fedyogi"],
                                 [10, 2, 1, 2, 1])
    if a["server_optimizer"] in ("fedadagrad", "fedadam", "fedyogi"):
        c["coordinator"]["server_lr"] = pick(rng, [0.01, 0.05, 0.1])
    if a["method"] == "trimmed_mean" and chance(rng, 0.5):
        a["trim_fraction"] = pick(rng, [0.0, 0.1, 0.2, 0.4])
    if chance(rng, 0.1):
        a["norm_bound"] = 0.0
    if chance(rng, 0.05):
        a["clip_norm"] = pick(rng, [1.0, 5.0])
    if chance(rng, 0.05):
        a["weight_cap"] = 0.0


def draw_round_policy(rng, c, clients, sync=True):
    """K, min_clients, quorum, deadlines, over-selection, selection and upload credits."""
    co = c["coordinator"]
    p = c["policy"]
    r = rng.random()
    if r < 0.08 and clients <= 100:
        k = clients  # every client, every round (a 1,000-task run takes some 25 s)
    elif r < 0.13 and clients <= 100:
        k = clients + rng.randint(1, 10)
    else:
        k = rng.randint(1, max(1, min(clients, 40)))
    co["clients_per_round"] = k
    r = rng.random()
    if r < 0.3:
        co["min_clients"] = rng.randint(1, k)
    elif r < 0.38:
        co["min_clients"] = k + rng.randint(1, 20)
    r = rng.random()
    if r < 0.4:
        co["quorum"] = rng.randint(1, k)
    elif r < 0.44:
        co["quorum"] = k + 1  # refused
    co["deadline_s"] = rounded(pick(rng, [rng.uniform(0.5, 5), rng.uniform(5, 120)], [1, 3]), 2)
    co["wait_clients_s"] = rounded(rng.uniform(30, 900), 1)
    if chance(rng, 0.25):
        p["deadline"] = "percentile"
        if chance(rng, 0.5):
            p["deadline_percentile"] = pick(rng, [0.5, 0.8, 0.9, 1.0])
            p["deadline_window"] = rng.randint(1, 5)
            p["deadline_slack"] = pick(rng, [1.0, 1.2, 2.0])
    if sync and chance(rng, 0.25):
        p["over_selection"] = rounded(rng.uniform(0.1, 1.0), 2)
    if chance(rng, 0.08):
        p["partial_work"] = True
    if chance(rng, 0.08):
        p["adaptive_steps"] = True
    if chance(rng, 0.1):
        co["max_concurrent_uploads"] = rng.randint(1, 4)
    if chance(rng, 0.08):
        co["fed_eval_every"] = rng.randint(1, 2)
    if chance(rng, 0.05):
        co["sample_from"] = "partitions"
        c["data"]["partitions"] = rng.randint(max(1, k - 2), k + 20)
    if chance(rng, 0.2):
        c["selection"]["selector"] = pick(rng, ["oort", "availability"])
    if chance(rng, 0.3):
        co["codec"] = pick(rng, CODECS, CODEC_WEIGHTS)


def draw_dp(rng, c, modes, weights):
    mode = pick(rng, modes, weights)
    if mode == "none":
        return
    if chance(rng, 0.85):
        c["aggregation"]["method"] = "fedavg"  # what DP needs
    d = c["dp"]
    d["mode"] = mode
    d["noise_multiplier"] = pick(rng, [0.3, 1.0, 2.0])
    d["clip_norm"] = pick(rng, [0.5, 1.0, 5.0])
    if chance(rng, 0.1):
        d["adaptive_clip"] = True
    if chance(rng, 0.2):
        d["target_epsilon"] = pick(rng, [1.0, 8.0])


def draw_sync(rng, c, clients):
    draw_round_policy(rng, c, clients, sync=True)
    draw_aggregation(rng, c)
    draw_dp(rng, c, ["none", "central", "local", "distributed"], [16, 3, 2, 1])


def draw_async(rng, c, clients):
    p = c["policy"]
    p["mode"] = "async"
    draw_round_policy(rng, c, clients, sync=False)
    if chance(rng, 0.05):
        p["over_selection"] = 0.5  # refused: sync only
    p["async_concurrency"] = pick(rng, [rng.randint(1, max(1, min(clients, 20))),
                                        clients + rng.randint(1, 5)], [9, 1])
    p["async_buffer"] = rng.randint(1, 10)
    p["max_staleness"] = rng.randint(0, 20)
    draw_aggregation(rng, c, allow_robust=False)
    c["aggregation"]["method"] = pick(rng, ["fedavg", "fednova", "median"], [12, 1, 1])
    draw_dp(rng, c, ["none", "central", "local"], [12, 1, 1])


def draw_secagg(rng, c, clients):
    draw_round_policy(rng, c, clients, sync=True)
    co = c["coordinator"]
    k = co["clients_per_round"]
    if k > 30 or chance(rng, 0.3):
        co["clients_per_round"] = k = rng.randint(2, max(2, min(clients, 30)))
    if chance(rng, 0.05):
        co["clients_per_round"] = k = 1  # refused
    co.pop("quorum", None)
    co.pop("min_clients", None)
    if chance(rng, 0.4):
        co["quorum"] = rng.randint(1, k)
    if chance(rng, 0.15):
        co["min_clients"] = rng.randint(1, k)
    c["secagg"]["mode"] = "secagg_plus"
    draw_aggregation(rng, c)
    c["aggregation"]["method"] = pick(
        rng, ["fedavg", "fednova", "median", "trimmed_mean", "scaffold"], [12, 4, 1, 1, 1])
    co["codec"] = pick(rng, ["none", "fp16", "qsgd8", "topk:0.01"], [17, 1, 1, 1])
    if chance(rng, 0.1):
        c["policy"]["mode"] = "async"  # refused
        c["policy"].pop("over_selection", None)
    if chance(rng, 0.15):
        # Even, or every pair (k - 1); 3 is refused unless it is k - 1.
        c["secagg"]["neighbours"] = pick(rng, [2, 4, max(1, k - 1), 3], [3, 3, 3, 1])
    if chance(rng, 0.05):
        c["secagg"]["threshold"] = rng.randint(1, max(1, k))
    if chance(rng, 0.1):
        c["secagg"]["stage_timeout_s"] = pick(rng, [1.0, 5.0, 30.0])
    if chance(rng, 0.05):
        c["blocks"] = {"count": 2, "rounds_per_block": 1}  # refused
    draw_dp(rng, c, ["none", "central", "distributed", "local"], [10, 3, 4, 1])


def draw_blocks(rng, c, clients, synthetic):
    draw_round_policy(rng, c, clients, sync=True)
    draw_aggregation(rng, c)
    b = c["blocks"]
    b["count"] = rng.randint(2, 5)
    if not synthetic and chance(rng, 0.04):
        b["count"] = 11  # refused with fashion-mnist
    r = rng.random()
    if r < 0.75:
        b["rounds_per_block"] = rng.randint(1, 2)
    elif r < 0.95:
        b["block_s"] = rounded(rng.uniform(1, 100), 1)
    else:
        b["rounds_per_block"] = 1
        b["block_s"] = 10.0  # refused: exactly one
    b["mode"] = pick(rng, ["single", "pluralistic", "multichain"])
    if chance(rng, 0.5):
        b["skew"] = rounded(rng.uniform(0, 1), 2)
    if chance(rng, 0.3):
        b["overlap"] = rounded(rng.uniform(0, 1), 2)
    if "test_subset" in c["data"]:
        c["data"]["test_subset"] = 1000
    if chance(rng, 0.9):
        b["validation_samples"] = rng.randint(10, 60)
        b["test_samples"] = rng.randint(10, 60)
    if chance(rng, 0.1):
        c["policy"]["mode"] = "async"  # refused
        c["policy"].pop("over_selection", None)
    draw_dp(rng, c, ["none", "central"], [12, 1])


def draw_decentralized(rng, c):
    c["policy"]["mode"] = "decentralized"
    d = c["decentralized"]
    algorithm = pick(rng, ["allreduce", "dpsgd", "adpsgd", "prague", "hop", "local"])
    d["algorithm"] = algorithm
    peers = rng.randint(2, 8)
    d["peers"] = peers
    d["iterations"] = rng.randint(1, 10)
    d["eval_every_s"] = rounded(rng.uniform(0.2, 10), 2)
    if chance(rng, 0.15):
        d["time_budget_s"] = rounded(rng.uniform(0.5, 30), 1)
        if chance(rng, 0.3):
            d["iterations"] = 0
    if algorithm in ("dpsgd", "adpsgd", "hop"):
        d["topology"] = pick(rng, ["ring", "torus", "random"])
        if d["topology"] == "random":
            d["degree"] = rng.randint(1, max(1, peers - 1))
    if algorithm == "prague":
        d["group_size"] = pick(rng, [rng.randint(2, peers), 4])
        d["group_buffer"] = rng.randint(1, 4)
    if algorithm == "hop":
        d["hop_bound"] = rng.randint(1, 3)
        d["hop_backup"] = rng.randint(0, 2)
    if algorithm == "local":
        d["local_steps"] = rng.randint(1, 4)
    if algorithm in ("allreduce", "local") and chance(rng, 0.3):
        d["codec"] = pick(rng, ["fp16", "qsgd8", "topk:0.1", "sign"])
    if algorithm == "allreduce" and chance(rng, 0.3):
        d["pipeline"] = 2
    if chance(rng, 0.3):
        d["steps_per_iteration"] = rng.randint(1, 3)
    if chance(rng, 0.4):
        d["mbps"] = pick(rng, [10.0, 100.0, 1000.0])
        d["latency_ms"] = pick(rng, [0.0, 5.0, 50.0])
    s = c["sim"]
    if peers > 2 and chance(rng, 0.15):
        s["peer_failures"] = 1
    if chance(rng, 0.2):
        s["slow_fraction"] = 0.25
        s["slow_factor"] = pick(rng, [2.0, 5.0])
    if chance(rng, 0.1):
        s["slowdown_probability"] = 0.2
        s["slowdown_factor"] = 3.0
        s["slowdown_s"] = 1.0


def tame(c):
    """Takes out the combinations the config check refuses (a tame draw runs, so that most
    draws exercise rounds rather than start-up checks)."""
    co, p, a, d = c["coordinator"], c["policy"], c["aggregation"], c["dp"]
    sa, b, t = c["secagg"], c["blocks"], c["train"]
    k = co.get("clients_per_round", 2)
    if co.get("quorum", 0) > k:
        del co["quorum"]
    if t.get("optimizer", "sgd") != "sgd":
        t.pop("momentum", None)
        if a.get("method") == "fednova":
            a["method"] = "fedavg"
    if a.get("method") == "scaffold":
        a.pop("clip_norm", None)
        if co.get("codec", "none").split(":")[0] in ("topk", "sign"):
            co["codec"] = "none"
    if p.get("mode") == "async":
        a["method"] = "fedavg"
        p.pop("over_selection", None)
        if d.get("mode") == "central":
            c["dp"] = d = {}
    if b:
        co.pop("sample_from", None)
        co.pop("fed_eval_every", None)
        p["mode"] = "sync"
        if "rounds_per_block" in b:
            b.pop("block_s", None)
        b["count"] = min(b["count"], 5)
        # A block's round samples only its own clients (about K / count of them).
        co["quorum"] = max(1, k // (2 * b["count"]))
        if b.get("mode") == "multichain":
            a["server_optimizer"] = "fedavg"
            if a.get("method") == "scaffold":
                a["method"] = "fedavg"
        if d.get("mode") == "central":
            c["dp"] = d = {}
    if sa:
        co.pop("sample_from", None)
        c["blocks"] = b = {}
        p["mode"] = "sync"
        co["codec"] = "none"
        co["clients_per_round"] = k = max(k, 2)
        if co.get("min_clients", 2) < 2:
            del co["min_clients"]
        if a.get("method") not in ("fedavg", "fednova"):
            a["method"] = "fedavg"
        sa.pop("threshold", None)
        if sa.get("neighbours") == 3 and k != 4:
            del sa["neighbours"]
        if d.get("mode") == "local":
            d["mode"] = "distributed"
    if d:
        if d["mode"] == "distributed" and not sa:
            d["mode"] = "central"
        a["method"] = "fedavg"
        a.pop("clip_norm", None)
        d.pop("target_epsilon", None)
        if d.get("adaptive_clip") and (sa or d["mode"] != "central" or
                                       k / 20 <= d["noise_multiplier"] / 2):
            del d["adaptive_clip"]


def draw_config(rng, cid):
    """One configuration: a dict of sections, and a one-line summary."""
    c = {s: {} for s in SECTIONS}
    c["run"]["name"] = cid
    c["run"]["seed"] = rng.randint(1, 1000000)
    c["run"]["rounds"] = rng.randint(1, 4)
    family = pick(rng, ["sync", "async", "secagg", "decentralized", "blocks"],
                  [45, 15, 15, 15, 10])
    synthetic = family != "decentralized" and chance(rng, 0.15)
    model = pick(rng, ["logreg", "mlp", "cnn"], [45, 50, 5])
    if synthetic and model == "cnn" and chance(rng, 0.5):
        model = "mlp"
    if synthetic:
        clients = rng.randint(2, 200)
    elif family == "decentralized":
        clients = rng.randint(2, 50)
    else:
        clients = log_uniform_int(rng, 2, 3000)
    draw_fleet(rng, c, clients)
    draw_data(rng, c, clients, synthetic, model)
    draw_train(rng, c, model)
    if family == "sync":
        draw_sync(rng, c, clients)
    elif family == "async":
        draw_async(rng, c, clients)
    elif family == "secagg":
        draw_secagg(rng, c, clients)
    elif family == "blocks":
        draw_blocks(rng, c, clients, synthetic)
    else:
        draw_decentralized(rng, c)
    if model == "cnn":
        co = c["coordinator"]
        co["clients_per_round"] = min(co.get("clients_per_round", 2), 5)
        for key in ("quorum", "min_clients"):
            if key in co:
                co[key] = min(co[key], co["clients_per_round"])
        c["run"]["rounds"] = min(c["run"]["rounds"], 2)
        if "peers" in c["decentralized"]:
            c["decentralized"]["peers"] = min(c["decentralized"]["peers"], 4)
            c["decentralized"]["iterations"] = min(c["decentralized"]["iterations"], 3)
    if family != "decentralized" and chance(rng, 0.7):
        tame(c)
    c["sim"]["progress"] = "off"
    c["sim"]["workers"] = 1
    c["history"]["db"] = "history.db"
    return c, summarize(family, c)


def summarize(family, c):
    co, s, d = c["coordinator"], c["sim"], c["data"]
    parts = [family, "model=" + c["model"]["name"], "data=" + d.get("format", "")]
    if "train_subset" in d:
        parts.append("train=%d/%s" % (d["train_subset"], d.get("partition", "")))
    parts.append("rounds=%d" % c["run"]["rounds"])
    if family == "decentralized":
        dc = c["decentralized"]
        parts += ["alg=" + dc["algorithm"], "peers=%d" % dc["peers"],
                  "iters=%d" % dc["iterations"]]
        for key in ("peer_failures", "slow_fraction"):
            if key in s:
                parts.append("%s=%s" % (key, s[key]))
        return " ".join(parts)
    parts.append("clients=%d" % s["clients"])
    parts.append("K=%d" % co.get("clients_per_round", 2))
    for key in ("min_clients", "quorum", "deadline_s", "codec"):
        if key in co:
            parts.append("%s=%s" % (key, co[key]))
    for key in ("deadline", "over_selection", "async_concurrency", "async_buffer"):
        if key in c["policy"]:
            parts.append("%s=%s" % (key, c["policy"][key]))
    parts.append("fleet=" + s["fleet"])
    parts.append("dropout=%s" % s["dropout"])
    if s["availability"] != "always":
        parts.append("diurnal=%sh" % s.get("online_hours", 0))
    if "stragglers" in s:
        parts.append("stragglers=%s/%s" % (s["stragglers"], s["straggler_mode"]))
    a = c["aggregation"]
    parts.append("agg=%s/%s" % (a.get("method", "fedavg"), a.get("server_optimizer", "fedavg")))
    if c["dp"]:
        parts.append("dp=" + c["dp"]["mode"])
    if c["blocks"]:
        b = c["blocks"]
        parts.append("blocks=%s/%s" % (b.get("count"), b.get("mode", "single")))
    return " ".join(parts)


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError("no TOML for %r" % (v,))


def to_toml(c, header):
    lines = ["# " + h for h in header]
    for section in SECTIONS:
        if not c.get(section):
            continue
        lines.append("")
        lines.append("[%s]" % section)
        for key, value in c[section].items():
            lines.append("%s = %s" % (key, toml_value(value)))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------
# Running and judging


class Run:
    """One run: what to run, where, and how it ended."""

    def __init__(self, rid, directory, toml_text, expect=None, expect_message=None):
        self.rid = rid
        self.dir = directory
        self.toml = toml_text
        self.expect = expect  # cases only
        self.expect_message = expect_message  # cases only: text the error must contain
        self.outcome = None
        self.message = ""
        self.wall = 0.0
        self.returncode = None


def last_line(text):
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()
    return ""


def check_history(path):
    """'' when the history file is sound, else why not."""
    try:
        con = sqlite3.connect(path, timeout=10)
    except sqlite3.Error as e:
        return "history does not open: %s" % e
    try:
        rows = con.execute("PRAGMA integrity_check").fetchall()
        if [r[0] for r in rows] != ["ok"]:
            return "PRAGMA integrity_check: %s" % "; ".join(str(r[0]) for r in rows[:5])
        tables = {r[0] for r in
                  con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "rounds" not in tables:
            return ""
        by_run = {}
        for run_id, rnd in con.execute("SELECT run_id, round FROM rounds ORDER BY run_id, round"):
            by_run.setdefault(run_id, []).append(rnd)
        for run_id, rounds in by_run.items():
            expected = list(range(rounds[0], rounds[0] + len(rounds)))
            if rounds != expected:
                missing = sorted(set(expected) - set(rounds))
                return "run %s: rounds not contiguous from %d: %s%s" % (
                    run_id, rounds[0], rounds[:20], " (missing %s)" % missing[:10]
                    if missing else "")
        return ""
    except sqlite3.Error as e:
        return "history unreadable: %s" % e
    finally:
        con.close()


def judge(run, returncode, stderr, hung):
    """Sets run.outcome and run.message from how the process ended."""
    line = last_line(stderr)
    found = [p for p in CRASH_PATTERNS if p in stderr]
    if hung:
        run.outcome, run.message = "hang", "still running after the bound; last stderr: " + line
    elif returncode < 0:
        run.outcome = "crash"
        run.message = "killed by signal %d; last stderr: %s" % (-returncode, line)
    elif found:
        run.outcome = "crash"
        run.message = "exit %d, stderr has %r; last stderr: %s" % (returncode, found[0], line)
    elif returncode == 0:
        run.outcome = "completed"
    elif returncode in (1, 2):
        if line.startswith("fedfleet sim: ") and "INTERNAL" not in line:
            run.outcome, run.message = "clean_error", line
        elif line.startswith("fedfleet sim: "):
            run.outcome, run.message = "crash", "internal error: " + line
        else:
            run.outcome = "crash"
            run.message = "exit %d without a 'fedfleet sim: ' line; last stderr: %s" % (
                returncode, line)
    else:
        run.outcome = "crash"
        run.message = "exit %d; last stderr: %s" % (returncode, line)
    db = os.path.join(run.dir, "history.db")
    if os.path.exists(db):
        why = check_history(db)
        if why:
            run.message = ("bad history: %s (run ended %s%s)" % (
                why, run.outcome, ": " + run.message if run.message else ""))
            run.outcome = "crash"


def execute(run, fedfleet, timeout):
    out_path = os.path.join(run.dir, "stdout.txt")
    err_path = os.path.join(run.dir, "stderr.txt")
    start = time.monotonic()
    hung = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        try:
            proc = subprocess.Popen([fedfleet, "sim", "--config", "config.toml"], cwd=run.dir,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    start_new_session=True)
        except OSError as e:  # e.g. the program is being rebuilt
            run.outcome, run.message = "crash", "could not start %s: %s" % (fedfleet, e)
            return run
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            hung = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    run.wall = time.monotonic() - start
    run.returncode = proc.returncode
    with open(err_path, "rb") as f:
        stderr = f.read().decode("utf-8", "replace")
    judge(run, proc.returncode, stderr, hung)
    return run


def failed(run):
    if run.expect is not None:
        if run.outcome != run.expect:
            return True
        return bool(run.expect_message) and run.expect_message not in run.message
    return run.outcome in ("hang", "crash")


def describe(run):
    text = "%-16s %-11s %6.1fs" % (run.rid, run.outcome, run.wall)
    if run.expect is not None:
        want = run.expect
        if run.expect_message:
            want += " with %r" % run.expect_message
        text += " (expect %s: %s)" % (want, "met" if not failed(run) else "UNMET")
    if run.message:
        msg = run.message
        if len(msg) > 400:
            msg = msg[:400] + "..."
        text += "  " + msg
    return text


def read_expectation(text):
    """From a case's leading comment lines: 'completed', 'clean_error' or None, and the text
    its error message must contain (None: any)."""
    expect, message = None, None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        m = re.match(r"#\s*expect:\s*(completed|clean_error)\s*$", stripped)
        if m:
            expect = m.group(1)
        m = re.match(r"#\s*expect-message:\s*(.*\S)\s*$", stripped)
        if m:
            message = m.group(1)
    return expect, message


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fedfleet", required=True, help="the fedfleet program")
    ap.add_argument("--seed", type=int, default=1, help="seed of the draws (default 1)")
    ap.add_argument("--count", type=int, default=50, help="configurations (default 50)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="wall-clock bound of one run in seconds (default 60)")
    ap.add_argument("--work", help="work directory (default: a new temporary one)")
    ap.add_argument("--cases", help="also run the regression cases DIR/*.toml")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args(argv)
    if args.count < 0 or args.jobs < 1 or args.timeout <= 0:
        ap.error("--count must be >= 0, --jobs >= 1 and --timeout > 0")
    return args


def main(argv):
    args = parse_args(argv)
    fedfleet = os.path.abspath(args.fedfleet)
    if not os.access(fedfleet, os.X_OK):
        print("combos.py: %s is not an executable program" % fedfleet, file=sys.stderr)
        return 2
    if args.work:
        work = os.path.abspath(args.work)
        os.makedirs(work, exist_ok=True)
    else:
        work = tempfile.mkdtemp(prefix="combos.")

    runs = []
    rng = random.Random(args.seed)
    for i in range(args.count):
        cid = "c%d-%04d" % (args.seed, i)
        sub = random.Random(rng.getrandbits(64))
        config, summary = draw_config(sub, cid)
        directory = os.path.join(work, cid)
        if os.path.isdir(directory):
            shutil.rmtree(directory)
        os.makedirs(directory)
        text = to_toml(config, ["combos.py --seed %d: config %d of %d" % (args.seed, i,
                                                                         args.count),
                                summary])
        with open(os.path.join(directory, "config.toml"), "w") as f:
            f.write(text)
        print("%s  %s" % (cid, summary))
        runs.append(Run(cid, directory, text))

    cases = []
    if args.cases:
        names = sorted(n for n in os.listdir(args.cases) if n.endswith(".toml"))
        for name in names:
            with open(os.path.join(args.cases, name)) as f:
                text = f.read()
            cid = "case:" + name[:-len(".toml")]
            directory = os.path.join(work, "cases", name[:-len(".toml")])
            if os.path.isdir(directory):
                shutil.rmtree(directory)
            os.makedirs(directory)
            with open(os.path.join(directory, "config.toml"), "w") as f:
                f.write(text)
            expect, message = read_expectation(text)
            run = Run(cid, directory, text, expect or "completed", message)
            if expect is None:
                run.outcome = "crash"
                run.message = "no '# expect: completed' or '# expect: clean_error' line"
            cases.append(run)
            print("%s  expect %s" % (cid, run.expect))
    sys.stdout.flush()

    lock = threading.Lock()
    started = time.monotonic()

    def work_one(run):
        if run.outcome is None:
            execute(run, fedfleet, args.timeout)
        with lock:
            print(describe(run))
            sys.stdout.flush()
        return run

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(work_one, runs + cases))
    elapsed = time.monotonic() - started

    bad = [r for r in runs + cases if failed(r)]
    for r in bad:
        print()
        print("==== FAILED %s: %s%s" % (r.rid, r.outcome,
                                        " (expected %s)" % r.expect if r.expect else ""))
        print("# %s" % r.message)
        if args.keep:
            print("# reproduce: cd %s && %s sim --config config.toml" % (r.dir, fedfleet))
        else:
            print("# reproduce: save the TOML below as config.toml and run "
                  "`%s sim --config config.toml` in its directory" % fedfleet)
        print(r.toml.rstrip())
    counts = {o: sum(1 for r in runs if r.outcome == o)
              for o in ("completed", "clean_error", "hang", "crash")}
    print()
    print("wall %.1f s for %d runs with %d jobs; work directory %s%s" % (
        elapsed, len(runs) + len(cases), args.jobs, work,
        " (kept)" if args.keep else " (removed)"))
    if cases:
        unmet = sum(1 for r in cases if failed(r))
        print("CASES total=%d met=%d unmet=%d" % (len(cases), len(cases) - unmet, unmet))
    print("RESULT configs=%d completed=%d clean_errors=%d hangs=%d crashes=%d" % (
        len(runs), counts["completed"], counts["clean_error"], counts["hang"], counts["crash"]))
    sys.stdout.flush()
    if not args.keep:
        # Only what this run made: a --work directory may hold other things.
        for r in runs + cases:
            shutil.rmtree(r.dir, ignore_errors=True)
        for leftover in (os.path.join(work, "cases"), work):
            try:
                os.rmdir(leftover)
            except OSError:
                pass
    ok = counts["hang"] == 0 and counts["crash"] == 0 and not any(failed(r) for r in cases)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
