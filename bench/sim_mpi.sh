#!/usr/bin/env bash
# The simulator over MPI ranks (sim/mpi_workers.h): the same CNN simulation with 1 and with 2
# training ranks of one LibTorch thread each, plus rank 0 (the engine and the history, which
# only encodes updates and waits), on this host (Open MPI, shared memory).
#
# Experiment: Fashion-MNIST, 100 clients Dirichlet(0.5), 10 sampled a round, E=1, B=32,
# lr 0.05, the FedAvg CNN, server evaluation on the 10k test set every round, ROUNDS rounds,
# the uniform fleet. A round's wall time is the time between the ends of consecutive rounds, as
# in bench/sim_vs_pytorch.sh; the figures are the medians.
# Figures: ranks1_s and ranks2_s (median round seconds), speedup = ranks1_s / ranks2_s,
# history_equal (1 when both runs wrote the same rounds and updates, every column but the
# wall-clock ones, and their checkpoints). Goals: speedup >= 1.7, history_equal = 1.
# Environment: BUILD_DIR (default build), ROUNDS (default 6), MODEL (default cnn).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-6}
MODEL=${MODEL:-cnn}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/sim_mpi.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

run() {  # training ranks -> db
  local ranks=$1 db="$WORK/ranks$1.db"
  mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np $((ranks + 1)) \
    "$FEDFLEET" sim --progress off --model "$MODEL" --clients 100 --clients-per-round 10 \
    --rounds "$ROUNDS" --fleet uniform --workers 1 --db "$db" \
    --set data.partition=\"dirichlet\" --set data.alpha=0.5 --set train.epochs=1 \
    --set train.batch=32 --set train.lr=0.05 --set coordinator.deadline_s=100000 \
    > "$WORK/ranks$ranks.log" 2>&1 || { cat "$WORK/ranks$ranks.log" >&2; exit 1; }
  echo "$db"
}

median_round() {
  sqlite3 "$1" "SELECT wall_end FROM rounds WHERE round >= 0 ORDER BY round" |
    awk 'NR > 1 {print $1 - prev} {prev = $1}' | median
}

# Every column the run decides (not the host's clock), reals with 17 digits, in row order.
table_dump() {  # db table "excluded columns" order
  local cols
  cols=$(sqlite3 "$1" "SELECT group_concat(
      'CASE typeof(\"' || name || '\") WHEN ''real'' THEN printf(''%!.17g'', \"' || name ||
      '\") ELSE quote(\"' || name || '\") END', ' || '','' || ')
    FROM pragma_table_info('$2') WHERE name NOT IN ($3)")
  sqlite3 "$1" "SELECT $cols FROM $2 ORDER BY $4"
}
history_dump() {
  { table_dump "$1" rounds "'wall_start','wall_end'" round
    table_dump "$1" updates "'id','wall_compute_s','encode_s','decode_s'" id
    table_dump "$1" events "'id'" id
    table_dump "$1" checkpoints "''" round; } | sha256sum | cut -d' ' -f1
}

echo "== 1 training rank ($MODEL, $ROUNDS rounds)" >&2
db1=$(run 1)
echo "== 2 training ranks" >&2
db2=$(run 2)
t1=$(median_round "$db1")
t2=$(median_round "$db2")
h1=$(history_dump "$db1")
h2=$(history_dump "$db2")
equal=$([ "$h1" = "$h2" ] && echo 1 || echo 0)
speedup=$(awk -v a="$t1" -v b="$t2" 'BEGIN {printf "%.3f", a / b}')
acc=$(sqlite3 "$db2" "SELECT printf('%.2f', 100 * test_accuracy) FROM rounds ORDER BY round DESC LIMIT 1")
echo "median round: 1 rank $t1 s, 2 ranks $t2 s; final accuracy $acc %; history digests $h1 / $h2" >&2
ok=$(awk -v s="$speedup" -v e="$equal" 'BEGIN {print (s >= 1.7 && e == 1) ? 1 : 0}')
echo "RESULT ranks1_s=$t1 ranks2_s=$t2 speedup=$speedup history_equal=$equal"
[ "$ok" = 1 ]
