#!/usr/bin/env bash
# Installs the Debian packages fedfleet needs, builds everything with tests and runs every test
# through ctest. Exits non-zero on any failure.
#   BUILD_DIR (default build), JOBS (default 2), CTEST_ARGS (extra ctest arguments)
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DFEDFLEET_BUILD_TESTS=ON
cmake --build "$BUILD_DIR" -j"$JOBS"

# Unit tests in parallel, then the multi-process tests one at a time (they start real processes
# that each want a core).
status=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$JOBS" -LE 'integration|docker' ${CTEST_ARGS:-} || status=1
ctest --test-dir "$BUILD_DIR" --output-on-failure -L 'integration|docker' ${CTEST_ARGS:-} || status=1
exit $status
