#!/usr/bin/env bash
# The GPU checks in one run, for a machine with an NVIDIA GPU, nvcc and CMake but not this
# project's other libraries: builds the CUDA kernels, the codecs and their GPU tests
# (FEDFLEET_GPU_ONLY=ON), runs the tests (a skipped one is a failure here: the GPU must be
# seen), then bench/kernels_gpu.sh. GoogleTest comes from the Debian .deb files in DEBS
# (default .device-debs; scripts/gpu_debs.sh fetches them), unpacked into PREFIX, not into /.
# Exit 0 when the tests pass and the benchmark's goals hold; the benchmark's RESULT line is the
# last line printed.
# Environment: BUILD_DIR (default build-gpu-only), ARCH (CUDA architectures, default 90),
# JOBS (default nproc), PREFIX (default /tmp/fedfleet-gpu-deps), OUT (a folder for the logs;
# default BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu-only}
DEBS=${DEBS:-.device-debs}
PREFIX=${PREFIX:-/tmp/fedfleet-gpu-deps}
LOGS=${OUT:-$BUILD_DIR}
mkdir -p "$PREFIX" "$BUILD_DIR" "$LOGS"

if ! nvidia-smi -L 2> /dev/null | grep '^GPU' > /dev/null; then
  echo "gpu_check: no GPU (nvidia-smi lists no device)"
  exit 1
fi
nvidia-smi -L
if compgen -G "$DEBS/*.deb" > /dev/null; then
  for f in "$DEBS"/*.deb; do dpkg -x "$f" "$PREFIX"; done
fi
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
"$NVCC" --version | tail -2
generator=()
if command -v ninja > /dev/null; then generator=(-G Ninja); fi
cmake -S . -B "$BUILD_DIR" "${generator[@]}" -DFEDFLEET_GPU_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DFEDFLEET_CUDA_ARCHITECTURES="${ARCH:-90}" \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr" > "$LOGS/gpu_cmake.log" 2>&1 || {
  tail -30 "$LOGS/gpu_cmake.log"
  exit 1
}
start=$(date +%s)
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" > "$LOGS/gpu_build.log" 2>&1 || {
  grep -E 'error|Error' "$LOGS/gpu_build.log" | head -40
  exit 1
}
echo "gpu_check: built in $(( $(date +%s) - start )) s"

tests_ok=1
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 4 > "$LOGS/gpu_tests.log" 2>&1 || tests_ok=0
grep -E 'tests passed|tests failed|\(Failed\)|\(Skipped\)|Not Run' "$LOGS/gpu_tests.log" || true
if grep -q '(Skipped)' "$LOGS/gpu_tests.log"; then
  echo "gpu_check: GPU tests were skipped although a GPU is listed"
  tests_ok=0
fi

bench_ok=1
BUILD_DIR=$BUILD_DIR bench/kernels_gpu.sh 2>&1 | tee "$LOGS/kernels_gpu.log" || bench_ok=0
echo "gpu_check: tests $([ $tests_ok = 1 ] && echo passed || echo FAILED)," \
  "benchmark goals $([ $bench_ok = 1 ] && echo hold || echo missed)"
tail -1 "$LOGS/kernels_gpu.log"
[ $tests_ok = 1 ] && [ $bench_ok = 1 ]
