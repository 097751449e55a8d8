#!/usr/bin/env bash
# Non-IID with systems heterogeneity: FedProx against FedAvg on FedProx's Synthetic(1, 1).
#
# The FedProx paper's setting (Li et al., MLSys 2020, section 5): 30 devices, 10 a round,
# multinomial logistic regression on Synthetic(1, 1) (dimension 60, 10 classes), E = 20 local
# epochs, batch B = 10, lr 0.01, ROUNDS rounds. A fraction of each round's tasks (0%, 50%, 90%)
# are stragglers that manage only a random 1..E-1 epochs (sim.stragglers):
#   fedavg   mu = 0, stragglers dropped (they never report: sim.straggler_mode = drop)
#   fedprox  mu = 1, stragglers' partial work kept (sim.straggler_mode = partial)
# Accuracy: the server's test accuracy on the 30 devices' test splits, averaged over the last
# 10 rounds (single evaluations of one round swing by a few points).
# Goal: FedProx beats FedAvg at 90% stragglers by at least 3 points.
# RESULT keys: fedavg_acc_<p>, fedprox_acc_<p> for p in 0 50 90 (percent), margin_90.
# Environment: BUILD_DIR (default build), ROUNDS (default 200), SEED (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ROUNDS=${ROUNDS:-200}
SEED=${SEED:-1}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/fedprox_synthetic.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

run() {  # name, stragglers fraction, mu, mode -> mean test accuracy (%) of the last 10 rounds
  local name=$1 frac=$2 mu=$3 mode=$4 db="$WORK/$1.db"
  "$FEDFLEET" sim --progress off --clients 30 --clients-per-round 10 --rounds "$ROUNDS" \
    --model logreg --db "$db" --set run.seed="$SEED" \
    --set data.dataset=\"synthetic\" --set data.synthetic_alpha=1 --set data.synthetic_beta=1 \
    --set train.epochs=20 --set train.batch=10 --set train.lr=0.01 --set train.prox_mu="$mu" \
    --set coordinator.quorum=1 --set coordinator.deadline_s=3600 \
    --set sim.stragglers="$frac" --set sim.straggler_mode=\"$mode\" > "$WORK/$name.log" 2>&1 || {
    cat "$WORK/$name.log" >&2
    exit 1
  }
  sqlite3 "$db" "SELECT printf('%.2f', 100 * AVG(test_accuracy)) FROM (SELECT test_accuracy
                 FROM rounds WHERE round > 0 AND test_accuracy IS NOT NULL
                 ORDER BY round DESC LIMIT 10)"
}

declare -A A
echo "== FedProx Synthetic(1,1): 30 devices, 10 a round, E=20, B=10, lr 0.01, $ROUNDS rounds" >&2
printf '  %-11s %8s %8s\n' stragglers fedavg fedprox >&2
for p in 0 50 90; do
  frac=$(awk -v p="$p" 'BEGIN {printf "%.2f", p / 100}')
  A[fedavg_$p]=$(run "fedavg_$p" "$frac" 0 drop)
  A[fedprox_$p]=$(run "fedprox_$p" "$frac" 1 partial)
  printf '  %-11s %7s%% %7s%%\n' "$p%" "${A[fedavg_$p]}" "${A[fedprox_$p]}" >&2
done
margin=$(awk -v a="${A[fedprox_90]}" -v b="${A[fedavg_90]}" 'BEGIN {printf "%.2f", a - b}')
status=1
if awk -v m="$margin" 'BEGIN {exit !(m >= 3)}'; then status=0; fi
echo "RESULT fedavg_acc_0=${A[fedavg_0]} fedprox_acc_0=${A[fedprox_0]}" \
     "fedavg_acc_50=${A[fedavg_50]} fedprox_acc_50=${A[fedprox_50]}" \
     "fedavg_acc_90=${A[fedavg_90]} fedprox_acc_90=${A[fedprox_90]} margin_90=$margin"
exit $status
