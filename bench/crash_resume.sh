#!/usr/bin/env bash
# Crash and resume: a real run (a coordinator and CLIENTS clients over CURVE on 127.0.0.1)
# whose coordinator is SIGKILLed KILLS times at seeded random points (see the plan below) and
# restarted with --resume each time; now and then (seeded) a client is SIGKILLed too while the
# coordinator is down and restarted under the same id. After the last kill a coordinator resumes the run to its
# end. Checks on the final history: every round 1..ROUNDS exactly once (lost_rounds,
# duplicate_rounds), `PRAGMA integrity_check` ok (integrity_ok = 1), and resume_cost_s: the
# median, over restarts, of (duration of the first round a restarted coordinator commits) minus
# the median duration of the other rounds. Goal: no lost or duplicate round, integrity ok,
# resume_cost_s < 2 (a restart costs about nothing, not a deadline: deadline_s is 60 here).
# Also printed: restart_to_round_s, the median time from a restart to its first committed round
# (process start, LibTorch, history, clients reconnecting, the round itself).
# Environment: BUILD_DIR (build), KILLS (20), CLIENTS (4), ROUNDS (150), SEED (1).
set -euo pipefail
cd "$(dirname "$0")/.."
KILLS=${KILLS:-20}
CLIENTS=${CLIENTS:-4}
ROUNDS=${ROUNDS:-150}
SEED=${SEED:-1}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/crash_resume.XXXXXX)
cleanup() {
  pkill -KILL -P $$ 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
"$FEDFLEET" keygen --dir "$WORK/keys" --coordinator --clients "$CLIENTS" > /dev/null
DB="$WORK/h.db"
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ENDPOINT="tcp://127.0.0.1:$PORT"

# The seeded random points, one line per kill: "<rounds> <seconds> <client to kill or 0>". One
# kill in five comes <seconds> (0-3 s) after the start, whatever the coordinator is doing
# (loading, waiting for clients, the first round); the others come <seconds> (0-0.3 s: in a
# round, its evaluation or its commit) after <rounds> (1-6) more rounds are in the history.
awk -v seed="$SEED" -v n="$KILLS" -v c="$CLIENTS" \
  'BEGIN { srand(seed); for (i = 0; i < n; i++) {
             if (rand() < 0.2) { r = 0; t = 3 * rand() } else { r = 1 + int(6 * rand()); t = 0.3 * rand() }
             k = rand() < 0.3 ? 1 + int(rand() * c) : 0;
             printf "%d %.2f %d\n", r, t, k } }' > "$WORK/plan"

coordinator() {  # $1: log file; $2: --resume or empty
  "$FEDFLEET" coordinator --keys "$WORK/keys" --bind "$ENDPOINT" --db "$DB" --model mlp \
    --rounds "$ROUNDS" --clients-per-round "$CLIENTS" --min-clients "$CLIENTS" --deadline 60 \
    --set coordinator.quorum="$CLIENTS" --set data.train_subset=4000 \
    --set data.test_subset=1000 --set coordinator.wait_clients_s=120 --set run.seed="$SEED" \
    --set run.name='"crash"' ${2:-} > "$1" 2>&1 &
  PID=$!
}
alive() { [ -e "/proc/$1" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null; }
declare -a CLIENT_PID
client() {  # $1: index
  "$FEDFLEET" client --keys "$WORK/keys" --id "client-$1" --coordinator "$ENDPOINT" \
    --model mlp --exit-idle 180 >> "$WORK/client-$1.log" 2>&1 &
  CLIENT_PID[$1]=$!
}
q() { sqlite3 -cmd ".timeout 5000" "$DB" "$1" < /dev/null 2>/dev/null || echo ""; }
# Highest round recorded, as the restarted coordinator will see it (0 before the run exists).
last_round() {
  local r
  r=$(q "SELECT COALESCE(MAX(round), 0) FROM rounds")
  echo "${r:-0}"
}

coordinator "$WORK/coordinator-0.log" ""
pid=$PID
for i in $(seq 1 "$CLIENTS"); do client "$i"; done
kills=0
client_kills=0
: > "$WORK/restarts"  # "<first round after the restart> <restart unix time>"
while read -r advance delay victim; do
  if [ "$advance" -gt 0 ]; then
    target=$(($(last_round) + advance))
    for _ in $(seq 1 1200); do  # 120 s at most
      [ "$(last_round)" -ge "$target" ] && break
      alive "$pid" || break
      sleep 0.1
    done
  fi
  sleep "$delay"
  if ! alive "$pid"; then break; fi  # the run ended (or failed) by itself
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null || true
  kills=$((kills + 1))
  if [ "$victim" != 0 ]; then
    kill -KILL "${CLIENT_PID[$victim]}" 2>/dev/null || true
    wait "${CLIENT_PID[$victim]}" 2>/dev/null || true
    client "$victim"
    client_kills=$((client_kills + 1))
  fi
  resume="--resume"
  [ -n "$(q "SELECT run_id FROM runs WHERE name = 'crash'")" ] || resume=""
  echo "$(($(last_round) + 1)) $(date +%s.%N)" >> "$WORK/restarts"
  coordinator "$WORK/coordinator-$kills.log" "$resume"
  pid=$PID
done < "$WORK/plan"

# The last coordinator runs the run to its end.
if ! wait "$pid"; then
  echo "the final coordinator failed:" >&2
  tail -20 "$WORK/coordinator-$kills.log" >&2
  exit 1
fi

rows=$(q "SELECT COUNT(*) FROM rounds WHERE round BETWEEN 1 AND $ROUNDS")
distinct=$(q "SELECT COUNT(DISTINCT round) FROM rounds WHERE round BETWEEN 1 AND $ROUNDS")
failed=$(q "SELECT COUNT(*) FROM rounds WHERE round > 0 AND status = 'failed'")
integrity=$(q "PRAGMA integrity_check")
integrity_ok=0
[ "$integrity" = ok ] && integrity_ok=1
lost=$((ROUNDS - distinct))
dup=$((rows - distinct))

# Round durations; the first round each restart committed, and when.
q "SELECT round, end_time - start_time, end_time FROM rounds WHERE round > 0 ORDER BY round" \
  | tr '|' ' ' > "$WORK/durations"
read -r resume_cost restart_to_round normal_s measured < <(awk '
  NR == FNR { first[$1] = 1; at[$1] = $2; next }
  { d[$1] = $2; end[$1] = $3 }
  function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n == 0 ? 0 : (n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2) }
  END {
    for (r in d) if (!(r in first) && r > 1) normal[++nn] = d[r]
    m = median(normal, nn)
    for (r in first) if (r in d) { cost[++nc] = d[r] - m; gap[nc] = end[r] - at[r] }
    printf "%.3f %.3f %.3f %d\n", median(cost, nc), median(gap, nc), m, nc }' \
  "$WORK/restarts" "$WORK/durations")

echo "kills $kills (client kills $client_kills), rounds recorded $rows of $ROUNDS" \
  "($failed failed), normal round ${normal_s} s, first rounds after a restart measured:" \
  "$measured" >&2
ok=1
[ "$kills" = "$KILLS" ] || { echo "the run finished after $kills kills (raise ROUNDS)" >&2; ok=0; }
[ "$lost" = 0 ] && [ "$dup" = 0 ] && [ "$integrity_ok" = 1 ] || ok=0
awk -v c="$resume_cost" 'BEGIN { exit !(c < 2) }' || ok=0
[ "$measured" -gt 0 ] || ok=0
echo "RESULT kills=$kills client_kills=$client_kills lost_rounds=$lost duplicate_rounds=$dup" \
  "integrity_ok=$integrity_ok resume_cost_s=$resume_cost restart_to_round_s=$restart_to_round" \
  "normal_round_s=$normal_s failed_rounds=$failed"
[ "$ok" = 1 ]
