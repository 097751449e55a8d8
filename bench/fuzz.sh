#!/usr/bin/env bash
# The long libFuzzer run of the harnesses in fuzz/: every harness for at least FUZZ_RUNS
# (10 million) executions from its committed seeds, two harnesses at a time on the 2 cores, the
# longest first. Counts crashes: crash-*, leak-*, timeout-* and oom-* artifacts, and a harness
# that exits non-zero without leaving one. Exit 0 when every harness did >= FUZZ_RUNS executions
# with no crash, else 1. The last line is `RESULT harnesses=N min_execs=M crashes=C`.
#
# Instrumentation (docs/BENCHMARKS.md has the measured execs/s): payload runs under ASan + UBSan
# (FUZZ_BUILD_DIR, the build the short run of scripts/test.sh uses): its decoders walk raw
# pointers over untrusted bytes in fedfleet's own kernels. config, wire and idx run under UBSan
# alone (FUZZ_UBSAN_BUILD_DIR), still with libFuzzer's coverage and crash detection (aborts,
# signals, uncaught exceptions, hangs, out-of-memory): 10 million executions under ASan cost
# about 11 CPU-minutes for config alone and 23-29 for the four, more than two cores have in 15
# minutes with the builds, while UBSan alone runs config about 2x, wire 2x and idx 2.5x as fast. The
# short run of scripts/test.sh fuzzes all four under ASan + UBSan.
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_UBSAN_BUILD_DIR (default
# build-fuzz-ubsan), FUZZ_RUNS (default 10000000), FUZZ_OUT (default $FUZZ_BUILD_DIR/bench-fuzz:
# each harness's log, corpus and artifacts), JOBS (default 2). Builds what is missing (clang);
# an existing build is reused after an incremental build.
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_UBSAN_BUILD_DIR=${FUZZ_UBSAN_BUILD_DIR:-build-fuzz-ubsan}
FUZZ_RUNS=${FUZZ_RUNS:-10000000}
FUZZ_OUT=${FUZZ_OUT:-$FUZZ_BUILD_DIR/bench-fuzz}
JOBS=${JOBS:-2}

# harness:build:max_len, in the order they start (the longest first).
HARNESSES=(
  "config:$FUZZ_UBSAN_BUILD_DIR:1024"
  "payload:$FUZZ_BUILD_DIR:4096"
  "wire:$FUZZ_UBSAN_BUILD_DIR:2048"
  "idx:$FUZZ_UBSAN_BUILD_DIR:2048"
)

if ! command -v clang++ > /dev/null || ! command -v cmake > /dev/null; then
  ./scripts/install-deps.sh
fi
start=$(date +%s)
build() {  # DIR SANITIZERS
  if [ ! -f "$1/CMakeCache.txt" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$1" -DFEDFLEET_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DFEDFLEET_FUZZ_SANITIZERS="$2" > /dev/null
  fi
  cmake --build "$1" -j"$JOBS" > "$1/bench-fuzz-build.log" 2>&1 ||
    { tail -30 "$1/bench-fuzz-build.log"; echo "fuzz: build of $1 failed"; exit 1; }
}
build "$FUZZ_BUILD_DIR" "address,undefined"
build "$FUZZ_UBSAN_BUILD_DIR" "undefined"
built=$(date +%s)
echo "fuzz: built in $((built - start)) s; ${#HARNESSES[@]} harnesses x $FUZZ_RUNS runs, $JOBS at a time"

run_one() {  # NAME BUILD MAX_LEN
  local dir="$FUZZ_OUT/$1"
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts"
  local t0 rc=0
  t0=$(date +%s.%N)
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    /usr/bin/time -f "%U %S" -o "$dir/cpu" "$2/fuzz/$1_fuzzer" -runs="$FUZZ_RUNS" -max_len="$3" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$dir/artifacts/" "$dir/corpus" "fuzz/corpus/$1" \
    > "$dir/log" 2>&1 || rc=$?
  echo "$rc $(date +%s.%N) $t0" > "$dir/status"
}

mkdir -p "$FUZZ_OUT"
running=0
for entry in "${HARNESSES[@]}"; do
  IFS=: read -r name dir max_len <<< "$entry"
  if ((running >= JOBS)); then
    wait -n
    running=$((running - 1))
  fi
  echo "fuzz: $name ($(grep -o 'FEDFLEET_FUZZ_SANITIZERS:STRING=.*' "$dir/CMakeCache.txt" | cut -d= -f2))"
  run_one "$name" "$dir" "$max_len" &
  running=$((running + 1))
done
wait

min_execs=""
crashes=0
for entry in "${HARNESSES[@]}"; do
  IFS=: read -r name dir max_len <<< "$entry"
  out="$FUZZ_OUT/$name"
  read -r rc t1 t0 < "$out/status"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log" | tail -1)
  execs=${execs:-0}
  seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }')
  rate=$(awk -v n="$execs" -v s="$seconds" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
  cpu=$(awk '{ printf "%.0f", $1 + $2 }' "$out/cpu" 2> /dev/null || echo 0)
  found=$(find "$out/artifacts" -type f \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  if ((rc != 0 && found == 0)); then found=1; fi
  crashes=$((crashes + found))
  if [ -z "$min_execs" ] || ((execs < min_execs)); then min_execs=$execs; fi
  sanitizers=$(grep -o 'FEDFLEET_FUZZ_SANITIZERS:STRING=.*' "$dir/CMakeCache.txt" | cut -d= -f2)
  echo "fuzz: $name sanitizers=$sanitizers max_len=$max_len execs=$execs seconds=$seconds" \
    "cpu_seconds=$cpu execs_per_s=$rate crashes=$found exit=$rc"
  if ((found > 0)); then
    grep -E -A12 'ERROR:|runtime error|contract broken|deadly signal|Test unit written' "$out/log" |
      head -40 || true
  fi
done
echo "fuzz: wall $(($(date +%s) - start)) s (build $((built - start)) s);" \
  "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "RESULT harnesses=${#HARNESSES[@]} min_execs=$min_execs crashes=$crashes"
if ((crashes == 0 && min_execs >= FUZZ_RUNS)); then exit 0; fi
exit 1
