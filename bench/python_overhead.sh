#!/usr/bin/env bash
# The price of the Python front door: the same simulation (the main job,
# examples/configs/sim_mobile_mix.toml: 1,000 mobile-mix clients, the built-in MLP on
# Fashion-MNIST, ROUNDS rounds) run as `fedfleet sim` and as fedfleet.simulate() from
# /usr/bin/python3, alternately, REPEATS times each. Each time is the whole process, from start
# to exit (Python's includes starting the interpreter and importing torch and fedfleet). The two
# histories must be equal (every round's accuracy, loss, counts and virtual times), or the
# benchmark fails: it would not be the same simulation. RESULT keys:
#   cli_s     median seconds of `fedfleet sim`
#   python_s  median seconds of fedfleet.simulate
#   ratio     python_s / cli_s (goal <= 1.05)
# Environment: BUILD_DIR (default build), ROUNDS (default 30), REPEATS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
ensure_python_package
ROUNDS=${ROUNDS:-30}
REPEATS=${REPEATS:-3}
CONFIG=examples/configs/sim_mobile_mix.toml
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

cli() {
  "$FEDFLEET" sim --config "$CONFIG" --db "$OUT/cli-$1.db" --rounds "$ROUNDS" --progress off \
    --log-level warn > /dev/null
}
py() {
  PYTHONPATH="$BUILD_DIR/python" /usr/bin/python3 -c '
import sys
import fedfleet
fedfleet.simulate(fedfleet.Config(sys.argv[1], rounds=int(sys.argv[3])), db=sys.argv[2],
                  progress=False)' "$CONFIG" "$OUT/py-$1.db" "$ROUNDS"
}
seconds() {  # seconds FUNCTION ARG: runs it, prints its wall time
  local t0=$EPOCHREALTIME
  "$@"
  awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'
}

cli_times=() py_times=()
for i in $(seq "$REPEATS"); do
  # Alternate which goes first, so that a drift in the machine's speed does not favour one.
  if ((i % 2)); then
    cli_times+=("$(seconds cli "$i")"); py_times+=("$(seconds py "$i")")
  else
    py_times+=("$(seconds py "$i")"); cli_times+=("$(seconds cli "$i")")
  fi
  printf 'repeat %d: cli %.2f s, python %.2f s\n' "$i" "${cli_times[-1]}" "${py_times[-1]}"
done

/usr/bin/python3 - "$OUT" "$REPEATS" "${cli_times[@]}" "${py_times[@]}" <<'PY'
import sqlite3, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
times = [float(t) for t in sys.argv[3:]]
cli_s, py_s = statistics.median(times[:n]), statistics.median(times[n:])
cols = ("round, status, selected, completed, late, dropped, rejected, train_loss, test_loss, "
        "test_accuracy, start_time, end_time, bytes_up, bytes_down, model_version")
def rounds(db):
    return sqlite3.connect(db).execute(f"SELECT {cols} FROM rounds ORDER BY round").fetchall()
same = rounds(f"{out}/cli-1.db") == rounds(f"{out}/py-1.db")
ratio = py_s / cli_s
print(f"histories equal: {same}; {len(rounds(out + '/cli-1.db'))} rounds")
ok = same and ratio <= 1.05
print(f"RESULT cli_s={cli_s:.2f} python_s={py_s:.2f} ratio={ratio:.3f}")
sys.exit(0 if ok else 1)
PY
