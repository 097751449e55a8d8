#!/usr/bin/env bash
# The unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (GCC): builds the project
# with -fsanitize=address,undefined -fno-omit-frame-pointer (RelWithDebInfo, ASAN_BUILD_DIR) and
# runs every test but the integration and Docker ones (ctest -LE 'integration|docker'), with
# leak detection on and the first UBSan report fatal. LibTorch, OpenBLAS and the other Debian
# libraries are not instrumented; bench/sanitize.supp suppresses reports from inside them (each
# entry says why), never from fedfleet's code. Not part of scripts/test.sh: the build and the
# run take longer than that script may (docs/BENCHMARKS.md has the times).
# The last line is `RESULT tests=N failures=F minutes=T` (T: build and tests, wall clock); exit 0
# when no test failed, else 1.
# Environment: ASAN_BUILD_DIR (default build-asan), JOBS (default 2), CTEST_ARGS (extra ctest
# arguments, e.g. -R 'Idx|Config').
set -euo pipefail
cd "$(dirname "$0")/.."

ASAN_BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
JOBS=${JOBS:-2}
./scripts/install-deps.sh

# Also for the build: gtest_discover_tests runs every test program to list its tests.
supp="$(pwd)/bench/sanitize.supp"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:strict_string_checks=1"
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
flags="-fsanitize=address,undefined -fno-omit-frame-pointer"

start=$(date +%s)
cmake -S . -B "$ASAN_BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFEDFLEET_BUILD_TESTS=ON \
  -DFEDFLEET_USE_CUDA=OFF -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" > /dev/null
cmake --build "$ASAN_BUILD_DIR" -j"$JOBS" > "$ASAN_BUILD_DIR/sanitize-build.log" 2>&1 ||
  { tail -40 "$ASAN_BUILD_DIR/sanitize-build.log"; echo "sanitize: build failed"; exit 1; }
built=$(date +%s)
echo "sanitize: built $ASAN_BUILD_DIR in $(((built - start) / 60)) min $(((built - start) % 60)) s"

log="$ASAN_BUILD_DIR/sanitize-ctest.log"
status=0
ctest --test-dir "$ASAN_BUILD_DIR" --output-on-failure -j"$JOBS" -LE 'integration|docker' \
  ${CTEST_ARGS:-} > "$log" 2>&1 || status=1
done_at=$(date +%s)
echo "sanitize: tests ran in $(((done_at - built) / 60)) min $(((done_at - built) % 60)) s"

summary=$(grep -E 'tests passed, [0-9]+ tests failed out of [0-9]+' "$log" | tail -1 || true)
tests=$(sed -nE 's/.* out of ([0-9]+).*/\1/p' <<< "$summary")
failures=$(sed -nE 's/.*, ([0-9]+) tests failed out of.*/\1/p' <<< "$summary")
if [ -z "$summary" ]; then
  tail -40 "$log"
  tests=0
  failures=1
fi
if ((failures > 0)); then
  sed -n '/The following tests FAILED/,$p' "$log"
  grep -E -m 20 'ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: ' "$log" || true
fi
minutes=$(awk -v s="$((done_at - start))" 'BEGIN { printf "%.1f", s / 60 }')
echo "RESULT tests=$tests failures=$failures minutes=$minutes"
if ((status == 0 && failures == 0)); then exit 0; fi
exit 1
