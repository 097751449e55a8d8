#!/usr/bin/env bash
# Real processes: a coordinator and 4 client processes on 127.0.0.1 over CURVE, with keys generated
# into a fresh directory, run 5 rounds of FedAvg on Fashion-MNIST split Dirichlet(0.5)
# (examples/configs/demo.toml, whose rounds need all 4 clients). Prints the accuracy of every
# round and where the SQLite history went.
#   FEDFLEET, BUILD_DIR, PREFIX, JOBS: which fedfleet runs (scripts/fedfleet_binary.sh); with
#     FEDFLEET=<program> nothing is built
#   OUT (default out/demo-processes-<time>), ROUNDS (default 5), PORT (default: a random one)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
source scripts/fedfleet_binary.sh

output_folder demo-processes
cd "$OUT"
PORT=${PORT:-$((20000 + RANDOM % 20000))}
CLIENTS=4

"$FEDFLEET" keygen --dir keys --coordinator --clients "$CLIENTS" > /dev/null
echo "demo: keys in $OUT/keys, coordinator on tcp://127.0.0.1:$PORT"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# The coordinator gives up when its 4 clients are not there within a minute, and each client
# leaves when the coordinator is silent for as long: nothing waits for ever.
"$FEDFLEET" coordinator --config "$ROOT/examples/configs/demo.toml" \
  --bind "tcp://127.0.0.1:$PORT" --keys keys --db "$OUT/history.db" \
  --rounds "${ROUNDS:-5}" --set coordinator.wait_clients_s=60 > coordinator.log 2>&1 &
coord=$!
for i in $(seq 1 "$CLIENTS"); do
  "$FEDFLEET" client --config "$ROOT/examples/configs/demo.toml" \
    --coordinator "tcp://127.0.0.1:$PORT" --id "client-$i" --keys keys --exit-idle 60 \
    > "client-$i.log" 2>&1 &
  pids+=($!)
done

# Show the rounds as they are committed.
tail -n +1 -f coordinator.log --pid "$coord" | grep --line-buffered -E ' round |error|history:' &
if ! wait "$coord"; then
  echo "demo: the coordinator failed; see $OUT/coordinator.log" >&2
  exit 1
fi
for p in "${pids[@]}"; do wait "$p" || true; done
pids=()
echo
"$FEDFLEET" history --db "$OUT/history.db"
echo
echo "history: $OUT/history.db"
echo "logs:    $OUT/coordinator.log, $OUT/client-*.log"
