#!/usr/bin/env bash
# Block-cyclic data: per-block accuracy of one global model (single) against the block-aware
# modes, pluralistic averaging (MM-PSGD) and multi-chain (MC-PSGD) (simulator).
#
# Fashion-MNIST, a cycle of M = 4 blocks of ROUNDS_PER_BLOCK rounds, CYCLES cycles. 400 clients;
# client k is available only in block k mod 4 (100 a block) and holds 125 samples of which 80%
# come from its block's class group (classes 0-2, 3-5, 6-7, 8-9) and 20% from all classes
# (blocks.skew = 0.8). 20 clients a round, MLP 784-200-200-10, 1 local epoch, batch 32, lr 0.05.
# At the end of every block the coordinator evaluates every block's served model on that block's
# test set (1000 samples with the block's class mix, drawn from the Fashion-MNIST test split;
# multichain chooses between its two candidates on a separate 500-sample validation set).
# Figure: a block's accuracy is the mean over the end-of-block evaluations of the last LAST
# cycles (4 x LAST evaluations); the mean is over the 4 blocks.
# Goal: pluralistic and multichain both beat single on mean per-block accuracy.
# RESULT keys: single_acc, pluralistic_acc, multichain_acc (percent).
# Environment: BUILD_DIR (default build), ROUNDS_PER_BLOCK (5), CYCLES (20), LAST (5), SEED (1),
# WORKERS (0: one per core).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
ROUNDS_PER_BLOCK=${ROUNDS_PER_BLOCK:-5}
CYCLES=${CYCLES:-20}
LAST=${LAST:-5}
SEED=${SEED:-1}
WORKERS=${WORKERS:-0}
BLOCKS=4
ROUNDS=$((BLOCKS * ROUNDS_PER_BLOCK * CYCLES))
FROM_ROUND=$((ROUNDS - BLOCKS * ROUNDS_PER_BLOCK * LAST))  # evaluations after this round count
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/block_cyclic.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

run_mode() {  # mode -> the run's database in $WORK/<mode>.db
  local mode=$1 t0 wall
  t0=$(date +%s.%N)
  "$FEDFLEET" sim --progress off --clients 400 --clients-per-round 20 --rounds "$ROUNDS" \
    --model mlp --db "$WORK/$mode.db" \
    --set run.seed="$SEED" --set sim.workers="$WORKERS" \
    --set blocks.count=$BLOCKS --set blocks.rounds_per_block="$ROUNDS_PER_BLOCK" \
    --set blocks.mode=\"$mode\" --set blocks.skew=0.8 \
    --set coordinator.eval_every=$((BLOCKS * ROUNDS_PER_BLOCK)) \
    --set coordinator.checkpoint_every=$((BLOCKS * ROUNDS_PER_BLOCK)) \
    --set train.epochs=1 --set train.batch=32 --set train.lr=0.05 > "$WORK/$mode.log" 2>&1 || {
    cat "$WORK/$mode.log" >&2
    exit 1
  }
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.0f", b - a}')
  echo "  $mode: $ROUNDS rounds, wall ${wall} s" >&2
}

# "acc0 acc1 acc2 acc3 mean" (percent) of `model` rows in a run's database.
block_row() {  # db, model
  sqlite3 -separator ' ' "$1" "SELECT printf('%.2f', 100 * AVG(accuracy)) FROM block_metrics
    WHERE model = '$2' AND round > $FROM_ROUND GROUP BY CAST(block AS INTEGER)
    ORDER BY CAST(block AS INTEGER)" | tr '\n' ' ' | awk '{
      s = 0; for (i = 1; i <= NF; i++) s += $i
      printf "%s %.2f", $0, (NF ? s / NF : 0) }'
}

echo "== block-cyclic: 4 blocks x $ROUNDS_PER_BLOCK rounds, $CYCLES cycles, 400 clients," \
     "20 a round; figures: mean of the end-of-block evaluations after round $FROM_ROUND" >&2
for mode in single pluralistic multichain; do run_mode "$mode"; done

declare -A MEAN
printf '%-24s %8s %8s %8s %8s %8s %10s\n' "mode (model)" block0 block1 block2 block3 mean \
  "vs single"
single_row=$(block_row "$WORK/single.db" served)
base=$(echo "$single_row" | awk '{print $5}')
for mode in single pluralistic multichain; do
  row=$(block_row "$WORK/$mode.db" served)
  MEAN[$mode]=$(echo "$row" | awk '{print $5}')
  printf '%-24s %8s %8s %8s %8s %8s %+9.2f\n' "$mode (served)" $row \
    "$(awk -v a="${MEAN[$mode]}" -v b="$base" 'BEGIN {print a - b}')"
done
# What the block-aware runs serve is made of: their shared chain, the block averages, the chains.
for pair in pluralistic:shared pluralistic:pluralistic multichain:shared multichain:pluralistic \
    multichain:chain; do
  mode=${pair%%:*}
  model=${pair##*:}
  row=$(block_row "$WORK/$mode.db" "$model")
  printf '%-24s %8s %8s %8s %8s %8s %+9.2f\n' "$mode ($model)" $row \
    "$(awk -v a="$(echo "$row" | awk '{print $5}')" -v b="$base" 'BEGIN {print a - b}')"
done
if [ "$(sqlite3 "$WORK/multichain.db" "SELECT COUNT(*) FROM block_metrics WHERE model = 'served'")" -gt 0 ]; then
  echo "multichain served the chain in $(sqlite3 "$WORK/multichain.db" "SELECT COUNT(*) FROM
    block_metrics s JOIN block_metrics c ON s.run_id = c.run_id AND s.round = c.round AND
    s.block = c.block AND c.model = 'chain' AND s.accuracy = c.accuracy AND s.loss = c.loss
    WHERE s.model = 'served' AND s.round > $FROM_ROUND") of $(sqlite3 "$WORK/multichain.db" \
    "SELECT COUNT(*) FROM block_metrics WHERE model = 'served' AND round > $FROM_ROUND")" \
    "block evaluations counted"
fi

status=1
if awk -v s="${MEAN[single]}" -v p="${MEAN[pluralistic]}" -v m="${MEAN[multichain]}" \
    'BEGIN {exit !(p > s && m > s)}'; then
  status=0
fi
echo "RESULT single_acc=${MEAN[single]} pluralistic_acc=${MEAN[pluralistic]}" \
     "multichain_acc=${MEAN[multichain]}"
exit $status
