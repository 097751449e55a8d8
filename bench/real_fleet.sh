#!/usr/bin/env bash
# Real deployment against the plain PyTorch loop.
#
# Baseline: bench/baselines/fedavg_pytorch.py (Debian's python3-torch), Fashion-MNIST, 100 clients
# split Dirichlet(0.5), 10 sampled a round, E=1, B=32, lr 0.05, plain SGD, server-side evaluation
# on the 10k test set every round; run with 1 and with 2 threads, the faster one counts.
# fedfleet: one coordinator and 10 client processes on 127.0.0.1 run the same experiment; the
# coordinator samples 10 of the 100 partitions each round and names one in each task
# (coordinator.sample_from = "partitions"), so the 10 processes train the 10 sampled partitions.
#
# Figures: median round time of each model (MLP 784-200-200-10 and the FedAvg CNN) over the
# Python loop's best; the largest sum of PSS over all fedfleet processes (coordinator and 10
# clients) sampled every 0.5 s during the MLP and the CNN runs;
# CURVE-on over CURVE-off median round time (MLP, two runs of each in the order on, off, off, on,
# all their rounds pooled). A fedfleet round time is the time between the
# ends of consecutive rounds, so it includes evaluation, the commit and the dispatch, as the
# Python loop's round does.
#
# Goals: cnn_ratio <= 0.5, mlp_ratio <= 0.6, total_pss_mib <= 2048, curve_overhead <= 1.05.
# Environment: BUILD_DIR (default build), MLP_ROUNDS (default 20), CNN_ROUNDS (default 4: the CNN
# loop takes tens of seconds a round on 2 cores, and the whole benchmark must fit 15 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
MLP_ROUNDS=${MLP_ROUNDS:-20}
CNN_ROUNDS=${CNN_ROUNDS:-4}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/real_fleet.XXXXXX)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$WORK"' EXIT

median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

# --- the plain PyTorch loop -------------------------------------------------------------------
python_round() {  # model threads rounds -> median round seconds
  /usr/bin/python3 bench/baselines/fedavg_pytorch.py --model "$1" --threads "$2" --rounds "$3" \
    > "$WORK/py-$1-$2.log" 2>&1
  sed -n 's/^RESULT .*median_round_s=\([0-9.]*\).*/\1/p' "$WORK/py-$1-$2.log"
}

# --- fedfleet: coordinator + 10 clients -------------------------------------------------------
pss_sum() {  # pids... -> summed PSS in KiB
  local total=0 kb
  for p in "$@"; do
    kb=$(awk '/^Pss:/ {print $2; exit}' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)
    total=$((total + ${kb:-0}))
  done
  echo "$total"
}

fleet_round() {  # model rounds secure(1|0) [tag] -> median round seconds
  # Leaves the peak PSS (KiB) in $dir/pss and every round time in $dir/rounds.
  local model=$1 rounds=$2 secure=$3 dir="$WORK/$1-$3${4:-}"
  mkdir -p "$dir"
  "$FEDFLEET" keygen --dir "$dir/keys" --coordinator --clients 10 > /dev/null
  local sec=() ; [ "$secure" = 1 ] || sec=(--insecure)
  "$FEDFLEET" coordinator "${sec[@]}" --name bench --model "$model" --rounds "$rounds" \
    --keys "$dir/keys" --db "$dir/h.db" --bind 'tcp://127.0.0.1:*' \
    --endpoint-file "$dir/endpoint" --clients-per-round 10 --min-clients 10 --deadline 600 \
    --set coordinator.quorum=10 --set coordinator.sample_from=partitions \
    --set data.partitions=100 --set data.partition=dirichlet --set data.alpha=0.5 \
    --set train.epochs=1 --set train.batch=32 --set train.lr=0.05 \
    --set coordinator.checkpoint_every=0 > "$dir/coordinator.log" 2>&1 &
  local coord=$!
  for _ in $(seq 1 600); do [ -s "$dir/endpoint" ] && break; sleep 0.1; done
  local ep; ep=$(cat "$dir/endpoint")
  local pids=("$coord")
  for i in $(seq 1 10); do
    "$FEDFLEET" client "${sec[@]}" --coordinator "$ep" --id "client-$i" --keys "$dir/keys" \
      --threads 1 --exit-idle 120 > "$dir/client-$i.log" 2>&1 &
    pids+=($!)
  done
  local peak=0
  while kill -0 "$coord" 2>/dev/null; do
    local now; now=$(pss_sum "${pids[@]}")
    [ "$now" -gt "$peak" ] && peak=$now
    sleep 0.5
  done
  echo "$peak" > "$dir/pss"
  wait "$coord" || { echo "coordinator failed:" >&2; tail -20 "$dir/coordinator.log" >&2; return 1; }
  for p in "${pids[@]:1}"; do wait "$p" || true; done
  sqlite3 "$dir/h.db" "SELECT end_time FROM rounds WHERE round >= 1 AND status = 'ok' ORDER BY round" \
    | awk 'NR > 1 {print $1 - prev} {prev = $1}' > "$dir/rounds"
  median < "$dir/rounds"
}

echo "== plain PyTorch loop (MLP $MLP_ROUNDS rounds, CNN $CNN_ROUNDS rounds)"
py_mlp1=$(python_round mlp 1 "$MLP_ROUNDS"); py_mlp2=$(python_round mlp 2 "$MLP_ROUNDS")
echo "mlp: 1 thread ${py_mlp1} s, 2 threads ${py_mlp2} s per round (median)"
py_cnn1=$(python_round cnn 1 "$CNN_ROUNDS"); py_cnn2=$(python_round cnn 2 "$CNN_ROUNDS")
echo "cnn: 1 thread ${py_cnn1} s, 2 threads ${py_cnn2} s per round (median)"

echo "== fedfleet: coordinator + 10 client processes on 127.0.0.1"
ff_mlp=$(fleet_round mlp "$MLP_ROUNDS" 1); pss=$(cat "$WORK/mlp-1/pss")
echo "mlp, CURVE:      ${ff_mlp} s per round (median), peak PSS $((pss / 1024)) MiB"
ff_mlp_plain=$(fleet_round mlp "$MLP_ROUNDS" 0)
echo "mlp, plain text: ${ff_mlp_plain} s per round (median)"
# CURVE against plain text once more, in the other order; the overhead is the ratio of the
# medians of all rounds of both runs of each, so drift of the machine weighs on both sides.
again_plain=$(fleet_round mlp "$MLP_ROUNDS" 0 b); again_curve=$(fleet_round mlp "$MLP_ROUNDS" 1 b)
echo "mlp, again:      ${again_plain} s plain text, ${again_curve} s CURVE per round (median)"
curve_all=$(cat "$WORK/mlp-1/rounds" "$WORK/mlp-1b/rounds" | median)
plain_all=$(cat "$WORK/mlp-0/rounds" "$WORK/mlp-0b/rounds" | median)
ff_cnn=$(fleet_round cnn "$CNN_ROUNDS" 1); pss_cnn=$(cat "$WORK/cnn-1/pss")
echo "cnn, CURVE:      ${ff_cnn} s per round (median), peak PSS $((pss_cnn / 1024)) MiB"
[ "$pss_cnn" -gt "$pss" ] && pss=$pss_cnn

read -r mlp_ratio cnn_ratio curve total_pss ok < <(awk -v fm="$ff_mlp" -v ca="$curve_all" -v pa="$plain_all" \
  -v fc="$ff_cnn" -v m1="$py_mlp1" -v m2="$py_mlp2" -v c1="$py_cnn1" -v c2="$py_cnn2" \
  -v pss="$pss" 'BEGIN {
    mb = (m1 < m2) ? m1 : m2; cb = (c1 < c2) ? c1 : c2
    mr = fm / mb; cr = fc / cb; co = ca / pa; pm = pss / 1024
    ok = (cr <= 0.5 && mr <= 0.6 && pm <= 2048 && co <= 1.05) ? 1 : 0
    printf "%.3f %.3f %.3f %.0f %d\n", mr, cr, co, pm, ok }')
echo "goals: cnn_ratio <= 0.5, mlp_ratio <= 0.6, total_pss_mib <= 2048, curve_overhead <= 1.05"
echo "RESULT mlp_ratio=$mlp_ratio cnn_ratio=$cnn_ratio total_pss_mib=$total_pss curve_overhead=$curve"
[ "$ok" = 1 ]
