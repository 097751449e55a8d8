#!/usr/bin/env bash
# GPU kernel bandwidth (bench/kernels_gpu.cc): weighted accumulate, QSGD 8-bit quantise and the
# top-k threshold select, each as a fraction of the device's copy bandwidth measured in the same
# run. Goal >= 0.7 each. RESULT keys: accumulate_bw_ratio quantize_bw_ratio topk_bw_ratio.
# Exit 0 when the goals hold, 1 when not, and 1 with "no GPU" on a machine without one.
# Environment: BUILD_DIR (default build), JOBS (default 2). Arguments go to the binary
# (--elements N, default 2^28; --reps R, default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L 2> /dev/null | grep '^GPU' > /dev/null; then
  echo "kernels_gpu: no GPU (nvidia-smi lists no device); nothing measured"
  exit 1
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
if ! cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target bench_kernels_gpu; then
  echo "kernels_gpu: could not build bench_kernels_gpu (is nvcc found? FEDFLEET_USE_CUDA must not be OFF)"
  exit 1
fi
exec "$BUILD_DIR/bench_kernels_gpu" "$@"
