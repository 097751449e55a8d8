#!/usr/bin/env bash
# Stragglers: virtual time to a target test accuracy under each straggler policy (simulator).
#
# Fashion-MNIST split Dirichlet(0.5) over 200 clients, MLP 784-200-200-10, 20 clients a round,
# 1 local epoch, batch 32, lr 0.05. The fleet (bench/fleets/stragglers.csv) is phone-like: 80%
# of the clients compute at the reference speed with 8/30 Mbit/s links, 20% are 10x slower in
# compute and links (log-normal jitter sigma 0.3 on both). Each policy runs until its test
# accuracy first reaches TARGET (run.target_accuracy) or MAX_ROUNDS server steps; the figure is
# the virtual time of that evaluation's round end.
#   wait_all     FedAvg waiting for every sampled client (no effective deadline)
#   oversel      over-selection b = 0.3 (aggregate the first 20 of 26) with a percentile
#                deadline (0.9 quantile of recent task durations x 1.2)
#   fedbuff      FedBuff: 20 training at once, a server step every 10 updates, max staleness 20
#   oort         Oort-style guided selection with the percentile deadline
#   deadline     fixed 4 s deadline, fixed local work (1 epoch): the baseline of `adaptive`
#   adaptive     local steps sized to each client's measured speed (fixed 4 s deadline), FedNova
# Goal: the best policy reaches the target in at most 0.3x the virtual time of wait_all.
# RESULT keys: <policy>_s (virtual seconds; "inf" when not reached), best_policy, best_ratio.
# Environment: BUILD_DIR (default build), TARGET (0.80), MAX_ROUNDS (400), SEED (1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
TARGET=${TARGET:-0.80}
MAX_ROUNDS=${MAX_ROUNDS:-400}
SEED=${SEED:-1}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/stragglers.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

run_policy() {  # name, extra --set arguments... -> prints virtual seconds to TARGET or inf
  local name=$1
  shift
  local db="$WORK/$name.db" t0
  t0=$(date +%s.%N)
  "$FEDFLEET" sim --progress off --clients 200 --clients-per-round 20 --rounds "$MAX_ROUNDS" \
    --model mlp --fleet "$ROOT/bench/fleets/stragglers.csv" --db "$db" \
    --set run.seed="$SEED" --set run.target_accuracy="$TARGET" \
    --set data.partition=\"dirichlet\" --set data.alpha=0.5 \
    --set train.epochs=1 --set train.batch=32 --set train.lr=0.05 "$@" > "$WORK/$name.log" 2>&1 || {
    cat "$WORK/$name.log" >&2
    exit 1
  }
  local wall reached rounds acc
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')
  reached=$(sqlite3 "$db" "SELECT MIN(end_time) FROM rounds WHERE test_accuracy >= $TARGET AND round > 0")
  rounds=$(sqlite3 "$db" "SELECT MAX(round) FROM rounds")
  acc=$(sqlite3 "$db" "SELECT printf('%.2f', 100 * MAX(test_accuracy)) FROM rounds")
  echo "  $name: $rounds server steps, best accuracy $acc%, ${reached:-not reached} virtual s" \
       "(wall ${wall} s)" >&2
  echo "${reached:-inf}"
}

echo "== stragglers: 200 clients (20% 10x slower), 20 a round, target $TARGET" >&2
declare -A T
T[wait_all]=$(run_policy wait_all --set coordinator.deadline_s=100000 --set coordinator.quorum=20)
T[oversel]=$(run_policy oversel --set policy.over_selection=0.3 --set policy.deadline=\"percentile\" \
  --set coordinator.deadline_s=120)
T[fedbuff]=$(run_policy fedbuff --set policy.mode=\"async\" --set policy.async_concurrency=20 \
  --set policy.async_buffer=10 --set policy.max_staleness=20 --set coordinator.deadline_s=120)
T[oort]=$(run_policy oort --set selection.selector=\"oort\" --set policy.deadline=\"percentile\" \
  --set coordinator.deadline_s=120)
T[deadline]=$(run_policy deadline --set coordinator.deadline_s=4)
T[adaptive]=$(run_policy adaptive --set policy.adaptive_steps=true --set aggregation.method=\"fednova\" \
  --set coordinator.deadline_s=4)

best=wait_all
for p in oversel fedbuff oort deadline adaptive; do
  if [ "${T[$p]}" != inf ] && { [ "${T[$best]}" = inf ] || awk -v a="${T[$p]}" -v b="${T[$best]}" 'BEGIN {exit !(a < b)}'; }; then
    best=$p
  fi
done
ratio=inf
if [ "${T[wait_all]}" != inf ] && [ "${T[$best]}" != inf ]; then
  ratio=$(awk -v a="${T[$best]}" -v b="${T[wait_all]}" 'BEGIN {printf "%.3f", a / b}')
fi
fmt() { [ "$1" = inf ] && echo inf || awk -v a="$1" 'BEGIN {printf "%.1f", a}'; }
status=1
if [ "$ratio" != inf ] && awk -v r="$ratio" 'BEGIN {exit !(r <= 0.3)}'; then status=0; fi
echo "RESULT wait_all_s=$(fmt "${T[wait_all]}") oversel_s=$(fmt "${T[oversel]}")" \
     "fedbuff_s=$(fmt "${T[fedbuff]}") oort_s=$(fmt "${T[oort]}") deadline_s=$(fmt "${T[deadline]}")" \
     "adaptive_s=$(fmt "${T[adaptive]}")" \
     "best_policy=$best best_ratio=$ratio"
exit $status
