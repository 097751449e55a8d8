#!/usr/bin/env bash
# Random simulator configurations: tests/sim/combos.py draws COUNT seeded configurations of
# `fedfleet sim` (fleet size, K, min_clients, quorum, over-selection, deadlines, dropout,
# diurnal availability, stragglers, sync / async / decentralised modes, codecs, aggregation
# methods and server optimisers, secure aggregation, differential privacy, block-cyclic data,
# Fashion-MNIST subsets and synthetic data; each run 1-4 small rounds), runs each JOBS at a
# time under a wall bound of TIMEOUT seconds, and sorts them into completed, clean errors (a
# refusal or a failed run, reported as `fedfleet sim: ...`), hangs and crashes (signals,
# INTERNAL errors, aborts, sanitizer reports, histories that fail PRAGMA integrity_check or skip
# a round number). Failing configurations are printed as TOML, ready to reproduce.
# Sized to finish within 15 minutes on 2 cores: the 300 runs took 277 s (seed 1, no hang; a
# completed run takes 1-13 s, so a hang costs TIMEOUT / JOBS of wall time).
# Exit 0 when there was no hang and no crash, else 1. The last line is
# `RESULT configs=N completed=A clean_errors=B hangs=C crashes=D`.
# Environment: BUILD_DIR (default build), COUNT (default 300), SEED (default 1), JOBS
# (default 2), TIMEOUT (seconds a run may take before it counts as a hang, default 30),
# CASES (a directory of regression cases to run too, e.g. tests/sim/combo_cases; default none),
# KEEP (1: keep the work directory with every config, log and history).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
COUNT=${COUNT:-300}
SEED=${SEED:-1}
JOBS=${JOBS:-2}
TIMEOUT=${TIMEOUT:-30}
CASES=${CASES:-}
KEEP=${KEEP:-0}

FEDFLEET="$(pwd)/$BUILD_DIR/cli/fedfleet"
if [ ! -x "$FEDFLEET" ]; then
  if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
    cmake --build "$BUILD_DIR" -j2 --target fedfleet
  else
    source bench/lib.sh  # installs the packages, configures and builds
  fi
fi

args=(--fedfleet "$FEDFLEET" --seed "$SEED" --count "$COUNT" --jobs "$JOBS"
      --timeout "$TIMEOUT")
[ -n "$CASES" ] && args+=(--cases "$CASES")
[ "$KEEP" = 1 ] && args+=(--keep)

echo "== combos: $COUNT random sim configurations, seed $SEED, $JOBS at a time," \
     "${TIMEOUT} s bound" >&2
log=$(mktemp /tmp/combos.XXXXXX.log)
trap 'rm -f "$log"' EXIT
start=$(date +%s)
set +e
/usr/bin/python3 tests/sim/combos.py "${args[@]}" 2>&1 | tee "$log" | grep -v '^RESULT '
status=${PIPESTATUS[0]}
set -e
echo "== combos: $(( $(date +%s) - start )) s wall" >&2
result=$(grep '^RESULT ' "$log" | tail -1 || true)
if [ -z "$result" ]; then
  echo "combos.py ended (status $status) without a RESULT line" >&2
  exit 1
fi
echo "$result"  # the last line
exit "$status"
