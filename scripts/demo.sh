#!/usr/bin/env bash
# The main job: a fleet simulation. 1,000 mobile-mix clients (phones and embedded boards whose
# compute and bandwidth span over 10x, online 16 h a day, 2% dropping out of a task) train the
# MLP on Fashion-MNIST split Dirichlet(0.5), 50 sampled a round, 30 rounds, with the
# coordinator's own round engine on a virtual clock (examples/configs/sim_mobile_mix.toml).
# Builds and installs `fedfleet` (or runs the one FEDFLEET names), prints progress, a summary
# and where the SQLite history went, then the rounds table, and writes the HTML report (charts,
# stragglers, config) next to the database.
# scripts/demo_processes.sh runs real coordinator and client processes over CURVE instead.
#   FEDFLEET, BUILD_DIR, PREFIX, JOBS: which fedfleet runs (scripts/fedfleet_binary.sh)
#   OUT (default out/demo-<time>), ROUNDS (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
source scripts/fedfleet_binary.sh

output_folder demo
echo "demo: simulating 1,000 mobile-mix clients; output in $OUT"
"$FEDFLEET" sim --config "$ROOT/examples/configs/sim_mobile_mix.toml" \
  --db "$OUT/history.db" --rounds "${ROUNDS:-30}" 2> >(tee "$OUT/sim.log" >&2)
echo
"$FEDFLEET" history --db "$OUT/history.db"
"$FEDFLEET" report --db "$OUT/history.db" -o "$OUT/report.html" > /dev/null
echo
echo "history: $OUT/history.db"
echo "report:  $OUT/report.html"
echo "log:     $OUT/sim.log"
