#!/usr/bin/env bash
# Coordinator memory over a long run: what grows per round is a leak.
#
# One real coordinator (CURVE, 127.0.0.1, logistic regression, evaluation on the 10k test set
# after every round, a checkpoint every round, two upload credits) and the load client
# (bench/load_client.cc) with CLIENTS clients that answer each task at once with a fake update;
# K clients a round (quorum K), ROUNDS rounds, so rounds take tens of milliseconds and the run
# passes through every per-round path (dispatch, grants, uploads, settlement, evaluation,
# commit, checkpoint pruning) hundreds of times.
# The coordinator's VmRSS (/proc/PID/status) is sampled as soon as the history holds round EARLY,
# and again after round LATE: the median of 5 readings 20 ms apart each time. The
# first EARLY rounds take the one-time growth (allocator arenas, SQLite's page cache, LibTorch's
# evaluation buffers); what the next LATE - EARLY rounds add is what a long run keeps adding.
# Figures: rss<EARLY>_mib, rss<LATE>_mib (rss50_mib, rss500_mib by default), rss_growth_pct =
# 100 (late - early) / early, peak_mib
# (VmHWM, /usr/bin/time), rounds (ok in the history). Goal: rss_growth_pct < 5, with all
# ROUNDS rounds ok.
# Environment: BUILD_DIR (build), CLIENTS (100), K (10), EARLY (50), LATE (500), ROUNDS
# (LATE + 100, so that the coordinator is still running when round LATE is sampled), CREDITS (2:
# coordinator.max_concurrent_uploads), COORDINATOR_FLAGS (more flags for the coordinator, e.g.
# "--set coordinator.eval_every=10"), KEEP_WORK (0; 1 keeps the logs and the history).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
CLIENTS=${CLIENTS:-100}
K=${K:-10}
EARLY=${EARLY:-50}
LATE=${LATE:-500}
ROUNDS=${ROUNDS:-$((LATE + 100))}
CREDITS=${CREDITS:-2}
source bench/lib.sh       # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/memory_soak.XXXXXX)
source bench/load_lib.sh  # LOAD_CLIENT, load_* helpers, the EXIT trap
load_need_files $((2 * CLIENTS + 256))

rss_kib() {  # median of 5 VmRSS readings of the coordinator, 20 ms apart
  local pid=$1
  for _ in 1 2 3 4 5; do
    load_vm_kib "$pid" VmRSS
    sleep 0.02
  done | load_median
}

"$FEDFLEET" keygen --dir "$WORK/keys" --coordinator --clients "$CLIENTS" > /dev/null
load_start_coordinator "$WORK" --name soak --model logreg --rounds "$ROUNDS" \
  --clients-per-round "$K" --min-clients "$CLIENTS" --deadline 60 \
  --set coordinator.quorum="$K" --set coordinator.max_concurrent_uploads="$CREDITS" \
  --set data.partition='"iid"' ${COORDINATOR_FLAGS:-}
pid=$(load_coordinator_pid)
load_start_client "$WORK" --clients "$CLIENTS" --seed 1 --time-limit-s 840 --exit-idle-s 120 \
  --progress-s 60
early_kib=0
late_kib=0
if load_wait_round "$WORK/h.db" "$EARLY" 600; then
  early_kib=$(rss_kib "$pid")
  echo "after round $EARLY: VmRSS $((early_kib / 1024)) MiB ($SECONDS s)" >&2
  if load_wait_round "$WORK/h.db" "$LATE" 780; then
    late_kib=$(rss_kib "$pid")
    echo "after round $LATE: VmRSS $((late_kib / 1024)) MiB ($SECONDS s)" >&2
  fi
fi
load_wait_coordinator 780
load_stop_client
grep -E '^(LOAD|load client: all)' "$WORK/load.log" >&2 || true
[ "$COORD_RC" = 0 ] || { echo "coordinator exit status $COORD_RC:" >&2; tail -20 "$WORK/coordinator.log" >&2; }

ok_rounds=$(sqlite3 "$WORK/h.db" \
  "SELECT COUNT(*) FROM rounds WHERE status = 'ok' AND round > 0" 2> /dev/null || echo 0)
read -r early_mib late_mib growth peak_mib ok < <(awk -v e="$early_kib" -v l="$late_kib" \
  -v p="$(tail -1 "$WORK/peak_kib")" 'BEGIN {
    g = e > 0 && l > 0 ? 100 * (l - e) / e : 1e9;
    printf "%.1f %.1f %.2f %.1f %d\n", e / 1024, l / 1024, g, p / 1024, (e > 0 && l > 0 && g < 5)}')
echo "RESULT rss_growth_pct=$growth rss${EARLY}_mib=$early_mib rss${LATE}_mib=$late_mib" \
  "peak_mib=$peak_mib rounds=$ok_rounds clients=$CLIENTS k=$K"
[ "$ok" = 1 ] && [ "$ok_rounds" = "$ROUNDS" ]
