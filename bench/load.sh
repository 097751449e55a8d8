#!/usr/bin/env bash
# Coordinator under a thousand connections: handshake rate, peak memory and round time.
#
# One real coordinator (CURVE, 127.0.0.1, logistic regression: 7,850 parameters, so that the
# cost measured is the coordinator's per-connection and per-message work, not arithmetic on
# models) and one load client process (bench/load_client.cc) holding CLIENTS CURVE connections,
# each with its own key and speaking the protocol; it answers each task at once (DELAY_S) with a
# fake update the coordinator accepts. The coordinator waits for all CLIENTS (min_clients), then
# runs ROUNDS rounds of K clients (clients_per_round; quorum = K: a round is ok only when all K
# updates were accepted), IID partitions of the training set, evaluation on the 10k test set
# after every round.
#
# Figures: handshakes_per_s, CLIENTS / the time from the load client's first connect to the
# last client's Hello taken (TCP, CURVE handshake, the ZAP check, Hello; the load client's
# handshake_s); rss_mib, the coordinator's peak RSS (/usr/bin/time, VmHWM); round_s, the median
# round time in the history (end_time - start_time: dispatch to the last update). Exit status 0
# when all ROUNDS rounds are ok in the history and all CLIENTS connected, else 1.
# Environment: BUILD_DIR (build), CLIENTS (1000), K (100), ROUNDS (10), DELAY_S (0: seconds from
# a task to its upload request), IO_THREADS (1: the load client's ZeroMQ I/O threads),
# KEEP_WORK (0; 1 keeps the logs and the history).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
CLIENTS=${CLIENTS:-1000}
K=${K:-100}
ROUNDS=${ROUNDS:-10}
DELAY_S=${DELAY_S:-0}
IO_THREADS=${IO_THREADS:-1}
source bench/lib.sh       # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/load.XXXXXX)
source bench/load_lib.sh  # LOAD_CLIENT, load_* helpers, the EXIT trap
load_need_files $((2 * CLIENTS + 256))

"$FEDFLEET" keygen --dir "$WORK/keys" --coordinator --clients "$CLIENTS" > /dev/null
load_start_coordinator "$WORK" --name load --model logreg --rounds "$ROUNDS" \
  --clients-per-round "$K" --min-clients "$CLIENTS" --deadline 120 \
  --set coordinator.quorum="$K" --set coordinator.wait_clients_s=300 \
  --set data.partition='"iid"'
load_start_client "$WORK" --clients "$CLIENTS" --delay-s "$DELAY_S" --io-threads "$IO_THREADS" \
  --seed 1 --time-limit-s 840 --exit-idle-s 120 --progress-s 30
load_wait_coordinator 780
load_stop_client
cat "$WORK/load.log" >&2
[ "$COORD_RC" = 0 ] || { echo "coordinator exit status $COORD_RC:" >&2; tail -20 "$WORK/coordinator.log" >&2; }

line=$(grep '^LOAD ' "$WORK/load.log" | tail -1 || true)
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<< "$line"; }
connected=$(field connected)
handshakes_per_s=$(field handshakes_per_s)
ok_rounds=$(sqlite3 "$WORK/h.db" \
  "SELECT COUNT(*) FROM rounds WHERE status = 'ok' AND round > 0" 2> /dev/null || echo 0)
round_s=$(sqlite3 "$WORK/h.db" \
  "SELECT end_time - start_time FROM rounds WHERE status = 'ok' AND round > 0" 2> /dev/null |
  load_median)
rss_mib=$(awk '{printf "%.1f", $1 / 1024}' < <(tail -1 "$WORK/peak_kib"))
round_s=$(printf '%.3f' "$round_s" 2> /dev/null || echo nan)
echo "coordinator: $ok_rounds/$ROUNDS rounds ok, ${connected:-0}/$CLIENTS clients connected," \
  "peak RSS $rss_mib MiB" >&2
echo "RESULT clients=$CLIENTS rounds=$ok_rounds handshakes_per_s=${handshakes_per_s:-0}" \
  "rss_mib=$rss_mib round_s=$round_s"
[ "$ok_rounds" = "$ROUNDS" ] && [ "${connected:-0}" = "$CLIENTS" ]
