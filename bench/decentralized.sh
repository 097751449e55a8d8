#!/usr/bin/env bash
# Decentralised training: virtual time to a fixed test accuracy for each peer algorithm
# (peer/peer_engine.h), simulated by `fedfleet sim` with policy.mode = "decentralized"
# (sim/peer_simulator.h).
#
# 16 peers, Fashion-MNIST split IID (one shard a peer), the MLP 784-200-200-10, batch 32,
# lr 0.05, one SGD step an iteration. Not the FedAvg CNN: at this reference device a CNN step
# of 32 samples takes 4.6 virtual seconds (7 samples/s), so a 150 s budget holds about 32 steps,
# far from the target, and its 5000-image evaluations took about 3 wall seconds each here (2
# cores, under load); the CNN would need its own device speed, budget and evaluation interval,
# not tuned here. The average of the peers' models is evaluated on 5000 test images every
# EVAL_S virtual seconds; the time to accuracy is the first evaluation at which the mean of the
# last 3 evaluations reaches TARGET (one evaluation alone swings by a few points at this
# learning rate, and would credit a lucky one), and the run stops there (or at BUDGET_S). The reference device trains at 0.5 GFLOP/s (76 ms a step of the MLP at batch 32).
#
# Heterogeneous setting (Prague's): 4 of the 16 peers compute 5x slower; 1 Gbit/s links, 1 ms.
#   allreduce   synchronous ring all-reduce of the gradients
#   dpsgd       D-PSGD on a ring, Metropolis weights
#   adpsgd      AD-PSGD on a ring (actives even, passives odd)
#   prague      Prague, groups of 4 from the generator's Group Buffer (4 batches)
#   hop         Hop on a ring, one backup worker, iteration gap bound 2
#   fedavg      FedAvg-style periodic averaging: algorithm local, H = 4 steps, outer lr 1,
#               no momentum (the peers' models averaged every 4 steps by an all-reduce)
# Homogeneous setting (Pipe-SGD's): no slow peers, 100 Mbit/s links, 1 ms.
#   plain       allreduce, pipeline 1, fp32
#   pipe        allreduce, pipeline 2 (one-step-stale overlap) with 8-bit quantisation (qsgd8,
#               error feedback) inside the all-reduce
# Goals: prague_speedup = tta_allreduce / tta_prague >= 3, tta_adpsgd < tta_allreduce, and
# pipe_speedup = tta_plain / tta_pipe >= 2. Exit 0 when all hold, 1 otherwise.
# Environment: BUILD_DIR (default build), TARGET (0.75), EVAL_S (1), BUDGET_S (virtual seconds
# of each heterogeneous run, 150; the homogeneous ones get half), SEED (1).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${TARGET:-0.75}
EVAL_S=${EVAL_S:-1}
BUDGET_S=${BUDGET_S:-150}
SEED=${SEED:-1}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/decentralized.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

run_algo() {  # name, budget, --set arguments... -> prints virtual seconds to TARGET or inf
  local name=$1 budget=$2
  shift 2
  local t0 wall tta line
  t0=$(date +%s.%N)
  "$FEDFLEET" sim --progress off --model mlp --db ":memory:" \
    --set policy.mode=\"decentralized\" --set run.seed="$SEED" \
    --set run.target_accuracy="$TARGET" --set data.partition=\"iid\" \
    --set data.test_subset=5000 --set train.batch=32 --set train.lr=0.05 \
    --set sim.reference_gflops=0.5 --set decentralized.peers=16 \
    --set decentralized.iterations=1000000 --set decentralized.time_budget_s="$budget" \
    --set decentralized.eval_every_s="$EVAL_S" "$@" > "$WORK/$name.log" 2>&1 || {
    cat "$WORK/$name.log" >&2
    exit 1
  }
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')
  tta=$(sed -n 's/^time to target: \([0-9.]*\) s virtual$/\1/p' "$WORK/$name.log")
  line=$(grep '^decentralized ' "$WORK/$name.log" || true)
  echo "  $name: ${tta:-not reached} virtual s to $TARGET; $line (wall ${wall} s)" >&2
  echo "${tta:-inf}"
}

HETERO=(--set sim.slow_fraction=0.25 --set sim.slow_factor=5 --set decentralized.mbps=1000
        --set decentralized.latency_ms=1)
HOMO=(--set decentralized.mbps=100 --set decentralized.latency_ms=1)

echo "== decentralized: 16 peers, MLP, Fashion-MNIST IID, target accuracy $TARGET" >&2
echo "-- heterogeneous: 4 of 16 peers 5x slower, 1 Gbit/s" >&2
declare -A T
T[allreduce]=$(run_algo allreduce "$BUDGET_S" "${HETERO[@]}" --set decentralized.algorithm=\"allreduce\")
T[dpsgd]=$(run_algo dpsgd "$BUDGET_S" "${HETERO[@]}" --set decentralized.algorithm=\"dpsgd\")
T[adpsgd]=$(run_algo adpsgd "$BUDGET_S" "${HETERO[@]}" --set decentralized.algorithm=\"adpsgd\")
T[prague]=$(run_algo prague "$BUDGET_S" "${HETERO[@]}" --set decentralized.algorithm=\"prague\" \
  --set decentralized.group_size=4 --set decentralized.group_buffer=4)
T[hop]=$(run_algo hop "$BUDGET_S" "${HETERO[@]}" --set decentralized.algorithm=\"hop\" \
  --set decentralized.hop_backup=1 --set decentralized.hop_bound=2)
T[fedavg]=$(run_algo fedavg "$BUDGET_S" "${HETERO[@]}" --set decentralized.algorithm=\"local\" \
  --set decentralized.local_steps=4 --set decentralized.outer_lr=1 \
  --set decentralized.outer_momentum=0)
echo "-- homogeneous: 100 Mbit/s" >&2
T[plain]=$(run_algo plain "$((BUDGET_S / 2))" "${HOMO[@]}" --set decentralized.algorithm=\"allreduce\")
T[pipe]=$(run_algo pipe "$((BUDGET_S / 2))" "${HOMO[@]}" --set decentralized.algorithm=\"allreduce\" \
  --set decentralized.pipeline=2 --set decentralized.codec=\"qsgd8\")

fmt() { [ "$1" = inf ] && echo inf || awk -v a="$1" 'BEGIN {printf "%.1f", a}'; }
ratio() {  # a / b, inf when either is inf
  if [ "$1" = inf ] || [ "$2" = inf ]; then echo inf; else awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; fi
}
prague_speedup=$(ratio "${T[allreduce]}" "${T[prague]}")
pipe_speedup=$(ratio "${T[plain]}" "${T[pipe]}")
status=0
awk -v r="$prague_speedup" 'BEGIN {exit !(r != "inf" && r >= 3)}' || status=1
awk -v r="$pipe_speedup" 'BEGIN {exit !(r != "inf" && r >= 2)}' || status=1
if [ "${T[adpsgd]}" = inf ] || { [ "${T[allreduce]}" != inf ] &&
   ! awk -v a="${T[adpsgd]}" -v b="${T[allreduce]}" 'BEGIN {exit !(a < b)}'; }; then
  status=1
fi
echo "goals: prague_speedup >= 3, tta_adpsgd < tta_allreduce, pipe_speedup >= 2:" \
     "$([ $status = 0 ] && echo met || echo NOT met)" >&2
echo "RESULT tta_allreduce=$(fmt "${T[allreduce]}") tta_dpsgd=$(fmt "${T[dpsgd]}")" \
     "tta_adpsgd=$(fmt "${T[adpsgd]}") tta_prague=$(fmt "${T[prague]}") tta_hop=$(fmt "${T[hop]}")" \
     "tta_fedavg=$(fmt "${T[fedavg]}") prague_speedup=$prague_speedup pipe_speedup=$pipe_speedup"
exit $status
