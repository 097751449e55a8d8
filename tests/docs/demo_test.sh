#!/usr/bin/env bash
# The two demo scripts as a newcomer runs them, given the program already built
# (FEDFLEET=<binary>: nothing is built or installed but the data set), shrunk through their
# own ROUNDS variable: each must finish, print where its history went, and leave that history
# with every round in it. Then the install rule: `cmake --install` puts a working `fedfleet`
# into a prefix.
#   demo_test.sh FEDFLEET_BINARY BUILD_DIR WORK_DIR
set -euo pipefail
binary=$1
build=$2
work=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"

rounds_in() {  # db -> the rounds of its latest run
  /usr/bin/python3 - "$1" <<'PY'
import sqlite3, sys
db = sqlite3.connect("file:%s?mode=ro" % sys.argv[1], uri=True)
run = db.execute("SELECT max(run_id) FROM runs").fetchone()[0]
print(",".join(str(r) for (r,) in db.execute(
    "SELECT round FROM rounds WHERE run_id = ? ORDER BY round", (run,))))
PY
}

echo "== scripts/demo.sh"
FEDFLEET=$binary OUT=$work/demo ROUNDS=2 "$root/scripts/demo.sh" > "$work/demo.txt" 2>&1 || {
  cat "$work/demo.txt"; echo "demo.sh failed" >&2; exit 1; }
grep -q "^history: $work/demo/history.db" "$work/demo.txt"
grep -q "^report:  $work/demo/report.html" "$work/demo.txt"
test -s "$work/demo/report.html"
[ "$(rounds_in "$work/demo/history.db")" = "0,1,2" ] || { echo "demo: rounds $(rounds_in "$work/demo/history.db")" >&2; exit 1; }
# The virtual clients' task lines are not in the demo's output.
if grep -q "task, partition" "$work/demo.txt"; then
  echo "demo.sh printed the virtual clients' task lines" >&2
  exit 1
fi

echo "== scripts/demo_processes.sh"
FEDFLEET=$binary OUT=$work/processes ROUNDS=1 "$root/scripts/demo_processes.sh" \
  > "$work/processes.txt" 2>&1 || {
  cat "$work/processes.txt" "$work"/processes/*.log; echo "demo_processes.sh failed" >&2; exit 1; }
grep -q "^history: $work/processes/history.db" "$work/processes.txt"
[ "$(rounds_in "$work/processes/history.db")" = "0,1" ] || { echo "processes: rounds" >&2; exit 1; }
# It ran the given program: nothing was configured or built.
if grep -q -- "-- Configuring\|Building CXX" "$work/processes.txt"; then
  echo "demo_processes.sh built although FEDFLEET was given" >&2
  exit 1
fi

echo "== cmake --install"
cmake --install "$build" --prefix "$work/prefix" --component fedfleet > /dev/null
"$work/prefix/bin/fedfleet" --help | grep -q "sim"
echo "demo scripts and install: ok"
