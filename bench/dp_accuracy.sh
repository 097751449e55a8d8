#!/usr/bin/env bash
# What differential privacy costs in accuracy: central DP-FedAvg on Fashion-MNIST.
#
# 1,000 simulated clients (Dirichlet(0.5) label skew, 60 samples each), 100 sampled a round
# (q = 0.1), the MLP, one local epoch of batch 16 at lr 0.05, ROUNDS rounds (default 100), the
# same seed throughout; the update clip C = CLIP (default 0.5), adaptive clipping off, delta just
# below 1/N (0.999 / 1,000: the engine requires delta < 1/N). For epsilon = 8, 3 and 1 the
# noise multiplier z that spends exactly that over the rounds is found first
# (bench/dp_calibrate.cc, the same accountant), then each run's final test accuracy is compared
# with the same run without DP.
# RESULT keys (accuracy in percent): acc_nodp acc_eps8 acc_eps3 acc_eps1, then the multipliers
# z_eps8 z_eps3 z_eps1 and the epsilon each run recorded. The figures are the result (the
# issue sets no accuracy goal); exit 0 when every run finished all its rounds and recorded the
# epsilon it was calibrated for (within 1.5% below the target, never above), else 1.
# Environment: BUILD_DIR (default build), ROUNDS (default 100), CLIP (default 0.5), WORKERS
# (default 0: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-100}
CLIP=${CLIP:-0.5}
WORKERS=${WORKERS:-0}
source bench/lib.sh  # FEDFLEET, built when missing
cmake --build "$BUILD_DIR" -j2 --target bench_dp_calibrate > /dev/null
WORK=$(mktemp -d /tmp/dp_accuracy.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
DELTA=0.000999

run() {  # name extra-set-args... -> "final_accuracy_percent recorded_epsilon rounds_done"
  local name=$1 db="$WORK/$1.db"
  shift
  "$FEDFLEET" sim --progress off --clients 1000 --clients-per-round 100 --rounds "$ROUNDS" \
    --model mlp --workers "$WORKERS" --db "$db" \
    --set data.partition=\"dirichlet\" --set data.alpha=0.5 --set data.train_subset=60000 \
    --set train.epochs=1 --set train.batch=16 --set train.lr=0.05 \
    --set coordinator.deadline_s=3600 "$@" > "$WORK/log-$name" 2>&1 || {
    cat "$WORK/log-$name" >&2
    exit 1
  }
  sqlite3 -separator ' ' "$db" \
    "SELECT printf('%.2f', 100 * test_accuracy), IFNULL(printf('%.3f', dp_epsilon), '-'),
            (SELECT COUNT(*) FROM rounds WHERE round >= 1 AND status = 'ok')
     FROM rounds ORDER BY round DESC LIMIT 1"
}

echo "== no DP" >&2
read -r acc_nodp _ done_nodp < <(run nodp)
echo "   accuracy $acc_nodp% after $done_nodp rounds" >&2
declare -A ACC Z EPS DONE
for eps in 8 3 1; do
  read -r z spent < <("$BUILD_DIR/bench_dp_calibrate" 0.1 "$ROUNDS" "$DELTA" "$eps")
  echo "== epsilon $eps: z = $z (epsilon after $ROUNDS rounds: $spent)" >&2
  read -r acc recorded done_rounds < <(run "eps$eps" --set dp.mode=\"central\" \
    --set dp.noise_multiplier="$z" --set dp.clip_norm="$CLIP" --set dp.delta="$DELTA" \
    --set dp.population=1000)
  ACC[$eps]=$acc Z[$eps]=$z EPS[$eps]=$recorded DONE[$eps]=$done_rounds
  echo "   accuracy $acc% after $done_rounds rounds, recorded epsilon $recorded" >&2
done
ok=$(awk -v r="$ROUNDS" -v d0="$done_nodp" -v d8="${DONE[8]}" -v d3="${DONE[3]}" \
  -v d1="${DONE[1]}" -v e8="${EPS[8]}" -v e3="${EPS[3]}" -v e1="${EPS[1]}" \
  'BEGIN {print ((d0 == r && d8 == r && d3 == r && d1 == r && e8 <= 8 && e8 >= 7.9 &&
                  e3 <= 3 && e3 >= 2.96 && e1 <= 1 && e1 >= 0.98) ? 1 : 0)}')
echo "RESULT acc_nodp=$acc_nodp acc_eps8=${ACC[8]} acc_eps3=${ACC[3]} acc_eps1=${ACC[1]}" \
  "z_eps8=${Z[8]} z_eps3=${Z[3]} z_eps1=${Z[1]} epsilon_eps8=${EPS[8]} epsilon_eps3=${EPS[3]}" \
  "epsilon_eps1=${EPS[1]} rounds=$ROUNDS clip=$CLIP"
[ "$ok" = 1 ]
