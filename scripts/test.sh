#!/usr/bin/env bash
# Installs the Debian packages fedfleet needs, builds everything with tests and runs every test
# through ctest, then builds the libFuzzer harnesses (fuzz/) with clang and fuzzes each for
# FUZZ_SECONDS from its seeds. Exits non-zero on any failure (a fuzzer's crash report is printed).
#   BUILD_DIR (default build), FUZZ_BUILD_DIR (default build-fuzz), FUZZ_SECONDS (default 10),
#   JOBS (default 2), CTEST_ARGS (extra ctest arguments)
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DFEDFLEET_BUILD_TESTS=ON
cmake --build "$BUILD_DIR" -j"$JOBS"

# Unit tests in parallel, then the multi-process tests, the docs and the random-configuration
# runs one at a time (they start real processes that each want a core, or use both).
status=0
serial='integration|docker|docs|combos'
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" -LE "$serial" ${CTEST_ARGS:-} || status=1
ctest --test-dir "$BUILD_DIR" --output-on-failure -L "$serial" ${CTEST_ARGS:-} || status=1

# The fuzz harnesses: their own clang build (ASan + UBSan, no LibTorch), one ctest test each.
FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
CC=clang CXX=clang++ cmake -S . -B "$FUZZ_BUILD_DIR" -DFEDFLEET_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFEDFLEET_FUZZ_SECONDS="${FUZZ_SECONDS:-10}" > /dev/null
cmake --build "$FUZZ_BUILD_DIR" -j"$JOBS"
ctest --test-dir "$FUZZ_BUILD_DIR" --output-on-failure -j"$JOBS" || status=1
exit $status
