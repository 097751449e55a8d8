#!/usr/bin/env bash
# Aggregation throughput on the CPU (bench/aggregate_bw.cc): 64 updates of 10M parameters
# folded into one fp32 accumulator on all cores, threads over ranges, through the codecs'
# decodeAccumulate. RESULT keys:
#   dense_ratio      dense fp32 folding bandwidth / STREAM triad bandwidth, same run (goal >= 0.9)
#   q8_ratio         QSGD 8-bit parameters/s / dense fp32 parameters/s (goal >= 0.8)
#   topk_mnnz_per_s  millions of (index, value) pairs/s folding top-k 1% payloads (goal >= 100)
# Exit 0 when all goals hold, else 1. Environment: BUILD_DIR (default build), JOBS (default 2).
# Arguments go to the binary (--params, --updates, --reps, --threads, --chunk, --topk-ratio).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target bench_aggregate_bw > /dev/null
exec "$BUILD_DIR/bench_aggregate_bw" "$@"
