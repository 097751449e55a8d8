#!/usr/bin/env bash
# Bytes and accuracy of the codecs, on the simulator.
#
# Fashion-MNIST Dirichlet(0.5), 100 clients, 10 a round, 30 rounds, the FedAvg CNN, E=1, B=32,
# lr 0.05, uniform fleet, one worker per core; the model is evaluated on the 10k test set every
# EVAL_EVERY rounds and after the last (the final accuracy is the last round's). Every codec runs
# the same job with the same seed; bytes are the update frames the clients uploaded (history
# updates.bytes_up), so framing counts.
# Figures: bytes_x = fp32 bytes / codec bytes; acc_drop = fp32 final accuracy - codec final
# accuracy (points). Goals: a codec of at least 50x fewer bytes within 1.5 points (the better
# of LOWRANK and TOPK counts: best_50x names it), qsgd8 >= 3.9x fewer within 0.5 points.
# LOWRANK (default "lowrank:10") sends each tensor as a rank-10 product of two fp16 factors; TOPK
# (default "topk:0.01,dense_below=10000": 1% of each tensor of 10,000 elements or more, the
# smaller tensors whole as fp16) keeps 1% of the values and misses the accuracy goal by about
# 3.5 points on this job; docs/BENCHMARKS.md has the measurements and why. Both use error
# feedback and are reported.
# Environment: BUILD_DIR (build), ROUNDS (30), EVAL_EVERY (10), TOPK, LOWRANK (above), CODECS
# (default the four the goals need: "none qsgd8 $TOPK $LOWRANK"; the full table in
# docs/BENCHMARKS.md used "none fp16 bf16 qsgd8 qsgd4 topk:0.01 $TOPK sign").
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-30}
EVAL_EVERY=${EVAL_EVERY:-10}
TOPK=${TOPK:-"topk:0.01,dense_below=10000"}
LOWRANK=${LOWRANK:-"lowrank:10"}
CODECS=${CODECS:-"none qsgd8 $TOPK $LOWRANK"}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/codecs_accuracy.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

printf "%-28s %12s %8s %9s %9s %8s\n" codec "MiB up" bytes_x "acc %" drop "wall s" >&2
declare -A BYTES ACC
for codec in $CODECS; do
  db="$WORK/$(echo "$codec" | tr ':,=' '___').db"
  start=$(date +%s.%N)
  "$FEDFLEET" sim --progress off --model cnn --clients 100 --clients-per-round 10 \
    --rounds "$ROUNDS" --fleet uniform --workers 0 --db "$db" \
    --set data.partition=\"dirichlet\" --set data.alpha=0.5 --set train.epochs=1 \
    --set train.batch=32 --set train.lr=0.05 --set coordinator.deadline_s=100000 \
    --set coordinator.eval_every="$EVAL_EVERY" --set coordinator.codec=\""$codec"\" \
    > "$WORK/log" 2>&1 || { cat "$WORK/log" >&2; exit 1; }
  wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
  BYTES[$codec]=$(sqlite3 "$db" "SELECT SUM(bytes_up) FROM updates WHERE status = 'completed'")
  ACC[$codec]=$(sqlite3 "$db" "SELECT 100 * test_accuracy FROM rounds WHERE round = $ROUNDS")
  base_bytes=${BYTES[none]:-${BYTES[$codec]}}
  base_acc=${ACC[none]:-${ACC[$codec]}}
  awk -v c="$codec" -v b="${BYTES[$codec]}" -v bb="$base_bytes" -v a="${ACC[$codec]}" \
    -v ba="$base_acc" -v w="$wall" \
    'BEGIN {printf "%-28s %12.1f %8.1f %9.2f %9.2f %8.0f\n", c, b / 1048576, bb / b, a, ba - a, w}' >&2
done
for need in none qsgd8 "$TOPK" "$LOWRANK"; do
  [ -n "${BYTES[$need]:-}" ] || { echo "codecs_accuracy: CODECS must include $need" >&2; exit 1; }
done
read -r topk_x topk_drop lr_x lr_drop q8_x q8_drop < <(awk -v n="${BYTES[none]}" \
  -v an="${ACC[none]}" -v t="${BYTES[$TOPK]}" -v at="${ACC[$TOPK]}" -v l="${BYTES[$LOWRANK]}" \
  -v al="${ACC[$LOWRANK]}" -v q="${BYTES[qsgd8]}" -v aq="${ACC[qsgd8]}" \
  'BEGIN {printf "%.1f %.2f %.1f %.2f %.2f %.2f\n", n / t, an - at, n / l, an - al, n / q, an - aq}')
# The 50x goal: met by LOWRANK, else by TOPK, else by neither ("none").
best=$(awk -v lx="$lr_x" -v ld="$lr_drop" -v tx="$topk_x" -v td="$topk_drop" \
  -v l="$LOWRANK" -v t="$TOPK" \
  'BEGIN {print (lx >= 50 && ld <= 1.5) ? l : (tx >= 50 && td <= 1.5) ? t : "none"}')
ok=$(awk -v b="$best" -v c="$q8_x" -v d="$q8_drop" \
  'BEGIN {print (b != "none" && c >= 3.9 && d <= 0.5) ? 1 : 0}')
echo "RESULT lowrank_bytes_x=$lr_x lowrank_acc_drop=$lr_drop topk_bytes_x=$topk_x" \
  "topk_acc_drop=$topk_drop q8_bytes_x=$q8_x q8_acc_drop=$q8_drop fp32_acc=${ACC[none]}" \
  "best_50x=$best"
[ "$ok" = 1 ]
