#!/usr/bin/env bash
# Every benchmark once, and which of them miss their own goals.
#
# Runs each bench/NAME.sh in turn (alphabetical), each under a time limit, keeps its whole output
# in $OUT_DIR/NAME.log, and prints a line per benchmark: passed (exit 0), failed (exit 1: a goal
# missed, or the run broke), timed out, or skipped with the reason. Then the list of those that
# failed with their last RESULT line, and last
#   RESULT benches=N passed=P failed=F skipped=S hours=H
# (F counts timed-out runs too). Exit 0 when none failed, else 1.
#
# Not run here: bench/sanitize.sh (two instrumented builds of the whole project, hours on
# 2 cores; run it on its own). Skipped with the reason when the machine lacks what they measure:
# bench/kernels_gpu.sh without a GPU (nvidia-smi lists none), bench/docker_build.sh without a
# Docker engine (`docker info` fails). The helpers lib.sh and load_lib.sh are not benchmarks.
#
# A full run takes several hours on 2 cores (each benchmark keeps to 15 minutes, fuzz.sh and the
# accuracy sweeps take longer); docs/BENCHMARKS.md has the last one.
# Environment: BENCHES (names to run, e.g. "fold_strategy aggregate_bw"; default all),
# BENCH_TIMEOUT_S (per benchmark, default 3600), OUT_DIR (default a new /tmp/bench-all.XXXXXX),
# and what the benchmarks themselves read (BUILD_DIR, ...).
set -uo pipefail
cd "$(dirname "$0")/.."
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-3600}
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/bench-all.XXXXXX)}
mkdir -p "$OUT_DIR"

if [ -n "${BENCHES:-}" ]; then
  read -r -a names <<< "$BENCHES"
else
  names=()
  for f in bench/*.sh; do
    n=$(basename "$f" .sh)
    case "$n" in all | lib | load_lib | sanitize) continue ;; esac
    names+=("$n")
  done
fi

# skip_reason NAME -> why this machine cannot run it (empty: it can).
skip_reason() {
  case "$1" in
    kernels_gpu)
      nvidia-smi -L 2> /dev/null | grep '^GPU' > /dev/null || echo "no GPU (nvidia-smi lists none)" ;;
    docker_build)
      timeout 20 docker info > /dev/null 2>&1 ||
        echo "no Docker engine (start it: dockerd --bridge=none --iptables=false)" ;;
  esac
}

start=$(date +%s)
passed=0 failed=0 skipped=0
failures=()
for n in "${names[@]}"; do
  script="bench/$n.sh"
  if [ ! -x "$script" ]; then
    echo "all: $n: no executable $script" >&2
    failed=$((failed + 1))
    failures+=("$n: no such benchmark")
    continue
  fi
  why=$(skip_reason "$n")
  if [ -n "$why" ]; then
    printf '%-20s skipped: %s\n' "$n" "$why"
    skipped=$((skipped + 1))
    continue
  fi
  log="$OUT_DIR/$n.log"
  t0=$(date +%s)
  timeout --signal=TERM --kill-after=60 "$BENCH_TIMEOUT_S" "$script" > "$log" 2>&1 < /dev/null
  rc=$?
  secs=$(($(date +%s) - t0))
  result=$(grep '^RESULT ' "$log" | tail -1)
  case $rc in
    0) state=passed passed=$((passed + 1)) ;;
    124 | 137) state="timed out after ${BENCH_TIMEOUT_S} s" failed=$((failed + 1)) ;;
    *) state="failed (exit $rc)" failed=$((failed + 1)) ;;
  esac
  printf '%-20s %s in %d s  %s\n' "$n" "$state" "$secs" "${result:-(no RESULT line; see $log)}"
  [ "$rc" = 0 ] || failures+=("$n: $state: ${result:-no RESULT line, see $log}")
done

echo "all: logs in $OUT_DIR"
if ((${#failures[@]} > 0)); then
  echo "all: missed their goals or broke:"
  printf '  %s\n' "${failures[@]}"
fi
hours=$(awk -v s="$(($(date +%s) - start))" 'BEGIN { printf "%.2f", s / 3600 }')
echo "RESULT benches=${#names[@]} passed=$passed failed=$failed skipped=$skipped hours=$hours"
((failed == 0))
