#!/usr/bin/env bash
# Fold strategy (bench/fold_strategy.cc): 50 updates of 1M fp32 parameters, one of them hostile
# (1e20 everywhere) and clipped by the norm bound, folded into the round's sum three ways:
# on arrival with a scaled take-back (the former engine path, the baseline), settled at the
# round's end from the kept payloads (the engine's path now; in memory and with the default
# 64 MiB PartialLog bound, spilling), and on arrival into an exactly undoable int64 fixed-point
# sum. RESULT keys:
#   settle_ratio        settle (in memory) time / arrival time (goal <= 2.0)
#   settle_spill_ratio  settle with the 64 MiB bound / arrival (goal <= 3.0)
#   fixed_ratio         fixed point / arrival (no goal)
#   settle_exact        settle's aggregate equals the exactly clipped average (goal 1)
#   arrival_exact       the same for arrival (0: the take-back loses the honest updates)
# Exit 0 when the goals hold, else 1. Environment: BUILD_DIR (default build), JOBS (default 2).
# Arguments go to the binary (--params, --updates, --reps, --chunk, --bound-mib, --norm-bound).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target bench_fold_strategy > /dev/null
exec "$BUILD_DIR/bench_fold_strategy" "$@"
