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
# The same experiment in `fedfleet sim` (100 virtual clients, one partition each, 10 sampled a
# round, every other setting the same, workers on both cores): the real fleet's median round over
# the simulator's (mlp_real_over_sim, cnn_real_over_sim), so what a deployment adds to the
# compute is measured on the same machine in the same run. Where the real round goes is printed
# from the history, as medians over rounds 2..N: `prepare` (the previous round's close to this
# round's tasks: the SQLite commit, the hand-off to evaluation, building the tasks), `download`
# (the last client's task less its own compute, encode, upload and credit wait: the model's
# transfer, check and load, queueing for the processor), `compute`, `encode`, `upload`, `wait`
# (upload credits) of that last client, `decode` (the coordinator's decoding of all the round's
# updates, summed) and `close` (the last summary's arrival to the round's close). Encryption is
# CURVE on against off (curve_overhead); evaluation runs on a background thread and shows only
# as processor time taken from the clients.
#
# Goals: cnn_ratio <= 0.5, mlp_ratio <= 0.6, total_pss_mib <= 2048, curve_overhead <= 1.05,
# mlp_real_over_sim <= 1.5, cnn_real_over_sim <= 1.2.
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

# --- fedfleet sim: the same experiment ----------------------------------------------------------
sim_round() {  # model rounds -> median round seconds (the ends of consecutive rounds, as above)
  local db="$WORK/sim-$1.db"
  "$FEDFLEET" sim --progress off --model "$1" --clients 100 --clients-per-round 10 \
    --rounds "$2" --fleet uniform --workers 0 --db "$db" --set data.partition=\"dirichlet\" \
    --set data.alpha=0.5 --set train.epochs=1 --set train.batch=32 --set train.lr=0.05 \
    --set coordinator.deadline_s=100000 > "$WORK/sim-$1.log" 2>&1 ||
    { cat "$WORK/sim-$1.log" >&2; return 1; }
  sqlite3 "$db" "SELECT wall_end FROM rounds WHERE round >= 1 AND status = 'ok' ORDER BY round" |
    awk 'NR > 1 {print $1 - prev} {prev = $1}' | median
}

breakdown() {  # history -> one line: medians of where a real round's time goes (see the header)
  sqlite3 -separator ' ' "$1" "
    WITH last AS (
      SELECT u.round, u.start_time, u.end_time, u.compute_s, u.encode_s, u.upload_s,
             COALESCE(u.grant_wait_s, 0) AS wait_s,
             ROW_NUMBER() OVER (PARTITION BY u.round ORDER BY u.end_time DESC) AS k
      FROM updates u WHERE u.status = 'completed'),
    dec AS (SELECT round, SUM(COALESCE(decode_s, 0)) AS decode_s FROM updates GROUP BY round)
    SELECT r.start_time - p.wall_end,
           (l.end_time - l.start_time) - l.compute_s - l.encode_s - l.upload_s - l.wait_s,
           l.compute_s, l.encode_s, l.upload_s, l.wait_s, d.decode_s, r.wall_end - l.end_time
    FROM rounds r JOIN rounds p ON p.round = r.round - 1 AND p.run_id = r.run_id
         JOIN last l ON l.round = r.round AND l.k = 1 JOIN dec d ON d.round = r.round
    WHERE r.round >= 2 AND r.status = 'ok' AND p.status = 'ok'" |
    awk 'function med(c,   n, i, j, t, v) {
           n = 0; for (i = 1; i <= NR; i++) v[++n] = col[i, c]
           for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
           return n == 0 ? 0 : (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) }
         { for (c = 1; c <= NF; c++) col[NR, c] = $c }
         END { split("prepare download compute encode upload wait decode close", name, " ")
               for (c = 1; c <= 8; c++) printf "%s %.4f s%s", name[c], med(c), (c < 8 ? ", " : "\n") }'
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
echo "== where a real round goes (medians over rounds 2..N; evaluation runs beside, in the background)"
echo "mlp, CURVE:      $(breakdown "$WORK/mlp-1/h.db")"
echo "mlp, plain text: $(breakdown "$WORK/mlp-0/h.db")"
echo "cnn, CURVE:      $(breakdown "$WORK/cnn-1/h.db")"

echo "== fedfleet sim: the same experiment, 100 virtual clients on both cores"
sim_mlp=$(sim_round mlp "$MLP_ROUNDS"); echo "mlp: ${sim_mlp} s per round (median)"
sim_cnn=$(sim_round cnn "$CNN_ROUNDS"); echo "cnn: ${sim_cnn} s per round (median)"

read -r mlp_ratio cnn_ratio curve total_pss mlp_rs cnn_rs ok < <(awk -v fm="$ff_mlp" \
  -v ca="$curve_all" -v pa="$plain_all" -v fc="$ff_cnn" -v m1="$py_mlp1" -v m2="$py_mlp2" \
  -v c1="$py_cnn1" -v c2="$py_cnn2" -v pss="$pss" -v sm="$sim_mlp" -v sc="$sim_cnn" 'BEGIN {
    mb = (m1 < m2) ? m1 : m2; cb = (c1 < c2) ? c1 : c2
    mr = fm / mb; cr = fc / cb; co = ca / pa; pm = pss / 1024; ms = fm / sm; cs = fc / sc
    ok = (cr <= 0.5 && mr <= 0.6 && pm <= 2048 && co <= 1.05 && ms <= 1.5 && cs <= 1.2) ? 1 : 0
    printf "%.3f %.3f %.3f %.0f %.3f %.3f %d\n", mr, cr, co, pm, ms, cs, ok }')
echo "goals: cnn_ratio <= 0.5, mlp_ratio <= 0.6, total_pss_mib <= 2048, curve_overhead <= 1.05," \
  "mlp_real_over_sim <= 1.5, cnn_real_over_sim <= 1.2"
echo "RESULT mlp_ratio=$mlp_ratio cnn_ratio=$cnn_ratio total_pss_mib=$total_pss" \
  "curve_overhead=$curve mlp_real_over_sim=$mlp_rs cnn_real_over_sim=$cnn_rs"
[ "$ok" = 1 ]
