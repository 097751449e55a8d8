#!/usr/bin/env bash
# NIID-Bench's Fashion-MNIST table (Li, Diao, Chen and He, "Federated Learning on Non-IID Data
# Silos: An Experimental Study", ICDE 2022, Table 3) in the setting of Flower's reproduction
# (flower/baselines/niid_bench): 10 parties, all sampled every round, 50 rounds, E = 10 local
# epochs, batch 64, SGD with lr 0.01, momentum 0.9 and weight decay 1e-5, the LeNet-style CNN
# (conv 6 and 16 channels of 5x5, fully connected 400-120-84-10: fedfleet's `lenet`), FedProx
# with mu 0.01, SCAFFOLD option II with the correction after the optimiser's step, FedNova with
# its momentum normaliser; split by Dirichlet(0.5) label skew (dir05) and by #C = 2 labels a
# party (c2). Each cell is the best test accuracy over the rounds on the 10,000 test images,
# printed beside the published cell with the gap (published - ours, in points).
#
# Published (Flower's reproduction, seed 42):
#   dir05: fedavg 88.4  fedprox 88.6  scaffold 88.4  fednova 88.1
#   c2:    fedavg 81.0  fedprox 78.8  scaffold 10.0  fednova 70.5
#
# A cell of 50 rounds takes 20-40 minutes on 2 AVX-512 cores (more on AVX2), so the whole
# table is past the 15-minute rule:
#   default   the dir05 row with ROUNDS rounds (default 4), within 15 minutes on 2 cores; the
#             cells then fall short of 50 rounds' accuracy, which the output says; the goal
#             checked is that no cell diverges (every round ok, accuracy over 70%)
#   FULL=1    both rows, 50 rounds each (about 3-5 hours)
#   CELLS="scaffold_dir05 fedavg_c2"   those cells only, 50 rounds each (fill the table over
#             several runs; docs/BENCHMARKS.md records each cell, its date and run time)
# With 50 rounds the goal is every cell within 1 point of the published one or above it
# (max_gap <= 1).
# RESULT keys: <method>_<split> (%, the cells run) and max_gap (points, the largest published -
# ours over them). Environment: BUILD_DIR, ROUNDS, FULL, CELLS, SEED (default 1), SUBSET
# (training samples, default all 60,000).
set -euo pipefail
cd "$(dirname "$0")/.."
SEED=${SEED:-1}
SUBSET=${SUBSET:-0}
FULL=${FULL:-0}
CELLS=${CELLS:-}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/niid_bench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

declare -A PUBLISHED=(
  [fedavg_dir05]=88.4 [fedprox_dir05]=88.6 [scaffold_dir05]=88.4 [fednova_dir05]=88.1
  [fedavg_c2]=81.0 [fedprox_c2]=78.8 [scaffold_c2]=10.0 [fednova_c2]=70.5
)
if [ -n "$CELLS" ]; then
  cells=($CELLS)
  ROUNDS=${ROUNDS:-50}
elif [ "$FULL" = 1 ]; then
  cells=(fedavg_dir05 fedprox_dir05 scaffold_dir05 fednova_dir05
         fedavg_c2 fedprox_c2 scaffold_c2 fednova_c2)
  ROUNDS=${ROUNDS:-50}
else
  cells=(fedavg_dir05 fedprox_dir05 scaffold_dir05 fednova_dir05)
  ROUNDS=${ROUNDS:-4}
fi
for cell in "${cells[@]}"; do
  if [ -z "${PUBLISHED[$cell]:-}" ]; then
    echo "niid_bench: unknown cell '$cell' (method_split: fedavg fedprox scaffold fednova x dir05 c2)" >&2
    exit 2
  fi
done

# One cell: its best test accuracy (%), and whether every round was ok.
run_cell() {  # cell -> "accuracy failed_rounds seconds"
  local cell=$1 method=${1%_*} split=${1#*_} db="$WORK/$1.db" args=()
  case $method in
    fedavg) args=(--set aggregation.method=\"fedavg\") ;;
    fedprox) args=(--set aggregation.method=\"fedavg\" --set train.prox_mu=0.01) ;;
    scaffold) args=(--set aggregation.method=\"scaffold\") ;;
    fednova) args=(--set aggregation.method=\"fednova\") ;;
  esac
  case $split in
    dir05) args+=(--set data.partition=\"dirichlet\" --set data.alpha=0.5) ;;
    c2) args+=(--set data.partition=\"labels\" --set data.labels_per_client=2) ;;
  esac
  local t0=$SECONDS
  "$FEDFLEET" sim --progress off --clients 10 --clients-per-round 10 --rounds "$ROUNDS" \
    --model lenet --db "$db" --set run.seed="$SEED" --set data.train_subset="$SUBSET" \
    --set train.epochs=10 --set train.batch=64 --set train.lr=0.01 --set train.momentum=0.9 \
    --set train.weight_decay=1e-5 --set sim.dropout=0 \
    --set coordinator.quorum=10 --set coordinator.deadline_s=1e9 \
    --set coordinator.max_failed_rounds=0 "${args[@]}" > "$WORK/$cell.log" 2>&1 || true
  local acc failed
  acc=$(sqlite3 "$db" "SELECT printf('%.2f', 100 * max(test_accuracy)) FROM rounds WHERE round > 0" \
        2>/dev/null || echo "")
  failed=$(sqlite3 "$db" "SELECT count(*) FROM rounds WHERE round > 0 AND status != 'ok'" \
           2>/dev/null || echo "?")
  if [ -z "$acc" ]; then
    tail -n 5 "$WORK/$cell.log" >&2
    acc=0.00
  fi
  echo "$acc $failed $((SECONDS - t0))"
}

echo "== NIID-Bench Fashion-MNIST: 10 parties, E=10, batch 64, lr 0.01, momentum 0.9," \
     "wd 1e-5, lenet, $ROUNDS rounds, seed $SEED" >&2
[ "$ROUNDS" -lt 50 ] && echo "   ($ROUNDS rounds, not the published 50: the gaps say how far the" \
  "short run is from the table, the goal is that no cell diverges)" >&2
printf '   %-15s %9s %10s %7s %8s %7s\n' cell ours published gap failed seconds >&2
result=""
max_gap=-1000
ok=1
for cell in "${cells[@]}"; do
  read -r acc failed seconds < <(run_cell "$cell")
  published=${PUBLISHED[$cell]}
  gap=$(awk -v p="$published" -v a="$acc" 'BEGIN { printf "%.2f", p - a }')
  printf '   %-15s %8s%% %9s%% %7s %8s %7s\n' "$cell" "$acc" "$published" "$gap" "$failed" \
    "$seconds" >&2
  result+=" $cell=$acc"
  max_gap=$(awk -v m="$max_gap" -v g="$gap" 'BEGIN { printf "%.2f", (g > m ? g : m) }')
  if [ "$ROUNDS" -ge 50 ]; then
    awk -v g="$gap" 'BEGIN { exit !(g <= 1) }' || ok=0
  else
    [ "$failed" = 0 ] && awk -v a="$acc" 'BEGIN { exit !(a > 70) }' || ok=0
  fi
done
echo "RESULT${result} max_gap=$max_gap"
[ "$ok" = 1 ]
