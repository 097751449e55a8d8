#!/usr/bin/env bash
# Coordinator memory under a burst of uploads: streaming aggregation keeps it O(model).
#
# A real coordinator (CURVE, FedAvg CNN: 1,663,370 parameters, 6.65 MB as fp32) and 50 real
# client processes on 127.0.0.1, all 50 sampled every round (coordinator.clients_per_round =
# min_clients = 50), one local step each (train.steps = 1), so the 50 uploads of 6.65 MB (codec
# none, 1 MiB chunks) are ready at about the same time; ROUNDS rounds. The coordinator grants
# CREDITS upload credits (coordinator.max_concurrent_uploads, default here 2): that many clients
# send chunks at once, the others wait for a grant.
# The fixed overhead is measured in the same run: the same coordinator config with 1 client
# (LibTorch, the test set, evaluation buffers, one model). Peak RSS from /usr/bin/time (VmHWM).
# Figures: peak_rss_mib (50 clients), model_mib, overhead_mib (1 client), and the ratio
# (peak - overhead) / model.
# Goal: peak_rss_mib <= overhead_mib + partial_buffer_mib + 3 * model_mib. The coordinator keeps
# each round's upload payloads until the round settles (they are folded once every norm and
# weight is known), in memory up to coordinator.partial_buffer_mib and in a spill file beyond:
# that buffer is memory the operator budgets, not growth with the clients, so the goal allows it
# and counts what is left in models (extra_models_over_buffer <= 3). PARTIAL_MIB=0 spills every
# kept payload, and the same goal is then the bare 3 models.
# Environment: BUILD_DIR (build), CLIENTS (50), ROUNDS (3), CREDITS (2: clients uploading at once),
# PARTIAL_MIB (64, the default coordinator.partial_buffer_mib).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
CLIENTS=${CLIENTS:-50}
CREDITS=${CREDITS:-2}  # coordinator.max_concurrent_uploads (0: unbounded, the default)
ROUNDS=${ROUNDS:-3}
PARTIAL_MIB=${PARTIAL_MIB:-64}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/coordinator_memory.XXXXXX)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$WORK"' EXIT
"$FEDFLEET" keygen --dir "$WORK/keys" --coordinator --clients "$CLIENTS" > /dev/null

run() {  # clients -> peak RSS of the coordinator in KiB
  local n=$1 dir="$WORK/run-$1"
  mkdir -p "$dir"
  /usr/bin/time -f "%M" -o "$dir/rss" "$FEDFLEET" coordinator --keys "$WORK/keys" \
    --bind 'tcp://127.0.0.1:*' --endpoint-file "$dir/endpoint" --db "$dir/h.db" --model cnn \
    --rounds "$ROUNDS" --clients-per-round "$n" --min-clients "$n" --deadline 600 \
    --set coordinator.quorum="$n" --set train.steps=1 --set data.test_subset=2000 \
    --set coordinator.wait_clients_s=600 \
    --set coordinator.max_concurrent_uploads="$CREDITS" \
    --set coordinator.partial_buffer_mib="$PARTIAL_MIB" > "$dir/coordinator.log" 2>&1 &
  local coord=$!
  for _ in $(seq 1 200); do [ -s "$dir/endpoint" ] && break; sleep 0.1; done
  local endpoint
  endpoint=$(cat "$dir/endpoint")
  for i in $(seq 1 "$n"); do
    "$FEDFLEET" client --keys "$WORK/keys" --id "client-$i" --coordinator "$endpoint" \
      --model cnn --exit-idle 60 > "$dir/client-$i.log" 2>&1 &
  done
  if ! wait "$coord"; then
    tail -20 "$dir/coordinator.log" >&2
    exit 1
  fi
  local rounds
  rounds=$(sqlite3 "$dir/h.db" "SELECT COUNT(*) FROM rounds WHERE status = 'ok' AND round > 0")
  [ "$rounds" = "$ROUNDS" ] || { echo "only $rounds ok rounds with $n clients" >&2; exit 1; }
  pkill -P $$ -f "fedfleet client" 2>/dev/null || true
  wait 2>/dev/null || true
  tail -1 "$dir/rss"
}

overhead_kib=$(run 1)
peak_kib=$(run "$CLIENTS")
read -r peak_mib overhead_mib model_mib ratio over_buffer ok < <(awk -v p="$peak_kib" \
  -v o="$overhead_kib" -v b="$PARTIAL_MIB" \
  'BEGIN {m = 1663370 * 4 / 1048576; pm = p / 1024; om = o / 1024;
          printf "%.1f %.1f %.2f %.2f %.2f %d\n", pm, om, m, (pm - om) / m, (pm - om - b) / m,
                 (pm <= om + b + 3 * m)}')
echo "coordinator peak RSS: $peak_mib MiB with $CLIENTS clients, $overhead_mib MiB with 1" >&2
echo "RESULT peak_rss_mib=$peak_mib model_mib=$model_mib overhead_mib=$overhead_mib" \
  "partial_buffer_mib=$PARTIAL_MIB extra_models=$ratio extra_models_over_buffer=$over_buffer"
[ "$ok" = 1 ]
