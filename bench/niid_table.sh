#!/usr/bin/env bash
# Non-IID table: FedAvg, FedProx, SCAFFOLD and FedNova on Fashion-MNIST (simulator).
#
# 10 clients, all sampled every round, MLP 784-200-200-10, the first SUBSET training samples
# (default 12,000) split over the clients in two ways: Dirichlet(0.5) label skew (dir05) and
# #C = 2 labels per client (c2). E = 2 local epochs, batch 32, client lr 0.05, ROUNDS rounds
# (default 20); FedProx mu = 0.1 (a value the FedProx paper tries; smaller is safer on
# Fashion-MNIST); SCAFFOLD option II control variates; FedNova with plain SGD normalisers (the
# clients' step counts differ with their data sizes). Test accuracy of the final model on the
# 10,000 test images.
# RESULT keys: <method>_<split> in percent, for method fedavg fedprox scaffold fednova and
# split dir05 c2. No goal: the table is the result (exit 0 when every cell ran).
# Rerun: bench/niid_table.sh (environment: BUILD_DIR, ROUNDS, SUBSET, SEED).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ROUNDS=${ROUNDS:-20}
SUBSET=${SUBSET:-12000}
SEED=${SEED:-1}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/niid_table.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

cell() {  # method, split -> final test accuracy (%)
  local method=$1 split=$2 db="$WORK/$1_$2.db" args=()
  case $method in
    fedavg) args=(--set aggregation.method=\"fedavg\") ;;
    fedprox) args=(--set aggregation.method=\"fedavg\" --set train.prox_mu=0.1) ;;
    scaffold) args=(--set aggregation.method=\"scaffold\") ;;
    fednova) args=(--set aggregation.method=\"fednova\") ;;
  esac
  case $split in
    dir05) args+=(--set data.partition=\"dirichlet\" --set data.alpha=0.5) ;;
    c2) args+=(--set data.partition=\"labels\" --set data.labels_per_client=2) ;;
  esac
  "$FEDFLEET" sim --progress off --clients 10 --clients-per-round 10 --rounds "$ROUNDS" \
    --model mlp --db "$db" --set run.seed="$SEED" --set data.train_subset="$SUBSET" \
    --set train.epochs=2 --set train.batch=32 --set train.lr=0.05 \
    --set coordinator.quorum=10 --set coordinator.deadline_s=100000 \
    --set coordinator.eval_every=5 "${args[@]}" > "$WORK/${method}_${split}.log" 2>&1 || {
    cat "$WORK/${method}_${split}.log" >&2
    exit 1
  }
  sqlite3 "$db" "SELECT printf('%.2f', 100 * test_accuracy) FROM rounds
                 WHERE test_accuracy IS NOT NULL ORDER BY round DESC LIMIT 1"
}

echo "== Fashion-MNIST, 10 clients all sampled, MLP, E=2, $ROUNDS rounds, $SUBSET samples" >&2
printf '  %-9s %8s %8s\n' method dir05 c2 >&2
result=""
for m in fedavg fedprox scaffold fednova; do
  a=$(cell "$m" dir05)
  b=$(cell "$m" c2)
  printf '  %-9s %7s%% %7s%%\n' "$m" "$a" "$b" >&2
  result+=" ${m}_dir05=$a ${m}_c2=$b"
done
echo "RESULT${result}"
