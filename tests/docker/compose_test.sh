#!/usr/bin/env bash
# The Docker deployment, end to end (ctest label `docker`):
#   1. use the Docker engine that answers (DOCKER_HOST or the default socket), else start one:
#      dockerd --bridge=none --iptables=false, data and sockets under a temp dir;
#   2. create debian:bookworm-slim with debootstrap + docker import when the engine lacks it;
#   3. build the runtime image from the host's `fedfleet` binary (docker/build.sh --prebuilt) and
#      check it holds no -dev package and no compiler;
#   4. docker/compose.yml with the test's env file: keygen, 1 coordinator, 6 fast + 2 slow client
#      replicas, 3 rounds (longer local training than the shipped job, so a round lasts seconds);
#   5. `docker kill` one slow client container while it trains its round-2 task (round 3 when it
#      joined too late for round 2);
#   6. check the history database from the volume with sqlite3: 3 rounds ok, 8 clients known
#      (client-1..client-8, client-i on partition i-1), accuracy rising, the killed client's
#      update dropped in that round and the round still ok;
#   7. tear down: compose down -v, the test image, and the engine it started with its data.
# Exits 0 on success, 1 on failure and 77 (ctest SKIP_RETURN_CODE) when no engine can be used.
#
#   tests/docker/compose_test.sh --binary build/cli/fedfleet [--cache DIR] [--keep]
# --cache DIR keeps the debootstrapped base file system between runs (saves ~40 s);
# --keep leaves everything in place for a look after a failure.
set -uo pipefail
export PATH=$PATH:/usr/sbin:/sbin
SKIP=77
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/docker/common.sh"

binary="" cache="" keep=0
while (($#)); do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "compose_test: unknown argument $1" >&2; exit 2 ;;
  esac
done

t0=$(date +%s)
step() { echo "[compose_test +$(($(date +%s) - t0))s] $*"; }
fail() { echo "compose_test: FAIL: $*" >&2; exit 1; }
skip() {
  echo "##############################################################################" >&2
  echo "compose_test: SKIPPED: $*" >&2
  echo "##############################################################################" >&2
  exit $SKIP
}

[ -x "$binary" ] || fail "--binary $binary is not an executable"
command -v docker > /dev/null || skip "no docker command (apt-get install docker.io docker-compose)"
command -v sqlite3 > /dev/null || fail "sqlite3 is not installed"

work=$(mktemp -d "${TMPDIR:-/tmp}/fft.XXXXXX")  # short: dockerd's sockets live under it
project="fft$$" image="fedfleet-test:$$" compose="" victim=""

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  if ((keep)); then
    echo "compose_test: --keep: project $project, image $image, work dir $work" \
      "${FEDFLEET_ENGINE_PID:+, engine pid $FEDFLEET_ENGINE_PID (DOCKER_HOST=$DOCKER_HOST)}"
    exit $rc
  fi
  step "tearing down"
  if [ -n "$compose" ]; then
    (cd "$root/docker" && $compose -p "$project" -f compose.yml down -v --remove-orphans) \
      > "$work/down.log" 2>&1 || cat "$work/down.log" >&2
  fi
  docker image rm -f "$image" > /dev/null 2>&1 || true
  fedfleet_engine_down "$work/engine"
  rm -rf "$work"
  step "done (exit $rc)"
  exit $rc
}
trap teardown EXIT
trap 'exit 1' INT TERM

# ---- 1. an engine ----------------------------------------------------------------------------
if docker info > /dev/null 2>&1; then
  step "using the running Docker engine (${DOCKER_HOST:-default socket})"
else
  step "starting dockerd --bridge=none --iptables=false under $work/engine"
  fedfleet_engine_up "$work/engine" || skip "no Docker engine can be used (see above)"
fi
compose=$(fedfleet_compose_command) || fail "neither 'docker compose' nor docker-compose is installed"
step "compose: $compose ($($compose version 2>/dev/null | head -n 1))"

# ---- 2. base image ---------------------------------------------------------------------------
if ! docker image inspect debian:bookworm-slim > /dev/null 2>&1; then
  step "creating debian:bookworm-slim (debootstrap + docker import)"
  "$root/docker/make-base-image.sh" ${cache:+--cache "$cache/debian-bookworm-slim.tar"} ||
    fail "could not create the base image"
fi

# ---- 3. the runtime image from the host binary -------------------------------------------------
step "building $image from $binary"
"$root/docker/build.sh" --prebuilt "$binary" --tag "$image" > "$work/build.log" 2>&1 ||
  { tail -n 40 "$work/build.log" >&2; fail "image build failed"; }
tail -n 1 "$work/build.log"
dev=$(docker run --rm --network none --entrypoint sh "$image" -c \
  'dpkg-query -W -f "\${Package}\n" | grep -- "-dev\$"; for c in gcc g++ cc c++ cpp clang; do command -v $c; done; true')
[ -z "$dev" ] || fail "the runtime image holds build tools: $dev"
[ "$(docker run --rm --network none --entrypoint id "$image" -u)" != 0 ] || fail "the image runs as root"

# ---- 4. the fleet ------------------------------------------------------------------------------
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2> /dev/null ||
  echo $((20000 + RANDOM % 20000)))
# The shipped env file with this test's port, and 32 local epochs instead of 2 so that a client
# trains for seconds and can be killed mid-round. (With 8, rounds 2 and 3 each gave the slow
# client 0.7 to 1.2 s between its task and its upload on a 2-core machine, shorter than a few
# turns of the loop below: a fresh-clone run missed both. A quarter of a core does not slow a
# client down when nine containers share two cores anyway.)
sed -e "s/^FEDFLEET_COORDINATOR_PORT=.*/FEDFLEET_COORDINATOR_PORT=$port/" \
  -e "s/^FEDFLEET_SET=.*/FEDFLEET_SET=train.epochs=32/" "$root/docker/fedfleet.env" > "$work/test.env"
grep -q "^FEDFLEET_CLIENTS=8$" "$work/test.env" || fail "docker/fedfleet.env no longer has FEDFLEET_CLIENTS=8"
export FEDFLEET_IMAGE=$image FEDFLEET_ENV_FILE=$work/test.env
dc() { (cd "$root/docker" && $compose -p "$project" -f compose.yml "$@"); }
containers() {  # ids of a service's containers
  docker ps -aq --filter "label=com.docker.compose.project=$project" \
    --filter "label=com.docker.compose.service=$1"
}

step "compose up: keygen, coordinator, 6 client + 2 client-slow replicas on 127.0.0.1:$port"
dc up -d --scale client=6 --scale client-slow=2 > "$work/up.log" 2>&1 ||
  { cat "$work/up.log" >&2; fail "compose up failed"; }
coordinator=$(containers coordinator)
[ -n "$coordinator" ] || fail "no coordinator container"
victim=$(containers client-slow | head -n 1)
[ -n "$victim" ] || fail "no client-slow container"

dump_logs() {
  echo "---- coordinator ----" >&2
  docker logs "$coordinator" 2>&1 | tail -n 40 >&2
  for c in $(containers client) $(containers client-slow); do
    echo "---- $(docker inspect -f '{{.Name}}' "$c") ----" >&2
    docker logs "$c" 2>&1 | tail -n 8 >&2
  done
}

# Freeze a container: `docker pause` (the cgroup freezer), or where the machine's runtime cannot
# freeze ("OCI runtime pause failed: unable to freeze"), SIGSTOP to each of its processes from
# the host (docker top lists their host PIDs; this test runs as root, as dockerd does).
# FEDFLEET_TEST_NO_PAUSE=1 takes the second way on any machine.
frozen_by=""
freeze() {
  if [ -z "${FEDFLEET_TEST_NO_PAUSE:-}" ] && docker pause "$1" > /dev/null 2>&1; then
    frozen_by=pause
    return 0
  fi
  local pids
  pids=$(docker top "$1" -eo pid | tail -n +2) || return 1
  [ -n "$pids" ] || return 1
  # shellcheck disable=SC2086
  kill -STOP $pids || return 1
  [ "$frozen_by" = sigstop ] || step "docker pause is not available here; freezing with SIGSTOP"
  frozen_by=sigstop
}
unfreeze() {
  if [ "$frozen_by" = pause ]; then
    docker unpause "$1" > /dev/null
  else
    # shellcheck disable=SC2046
    kill -CONT $(docker top "$1" -eo pid | tail -n +2)
  fi
}

# ---- 5. kill one slow client while it trains (round 2, or 3 if it joined late) ----------------
step "waiting for $(docker inspect -f '{{.Name}}' "$victim") to receive a task of round 2 or 3"
victim_id="" kill_round=""
for _ in $(seq 1 600); do
  # The newest task of round 2 or 3 it has not uploaded yet (on a loaded machine this loop may
  # first look after the round-2 upload: then it waits for round 3).
  logs=$(docker logs "$victim" 2>&1)
  line=$(grep -E 'client-[0-9]+: round [23] task' <<<"$logs" | tail -n 1 || true)
  if [ -n "$line" ]; then
    id=$(sed -E 's/.*client (client-[0-9]+): round [23] task.*/\1/' <<<"$line")
    r=$(sed -E 's/.*: round ([23]) task.*/\1/' <<<"$line")
    if ! grep -q "$id: round $r uploaded" <<<"$logs"; then
      # Freeze it, then look again: the upload may have finished since the logs were read, and
      # a frozen client cannot finish it between this check and the kill.
      freeze "$victim" || fail "could not freeze $victim (docker pause, then SIGSTOP from the host)"
      if ! docker logs "$victim" 2>&1 | grep -q "$id: round $r uploaded"; then
        victim_id=$id kill_round=$r
        break
      fi
      unfreeze "$victim" || fail "could not unfreeze $victim"
    fi
  fi
  [ "$(docker inspect -f '{{.State.Running}}' "$victim")" = true ] || break
  sleep 0.2
done
[ -n "$victim_id" ] || { dump_logs; fail "the slow client never got a task in round 2 or 3"; }
docker kill "$victim" > /dev/null || fail "docker kill failed"  # SIGKILL reaches a frozen one
step "killed $victim_id mid-round $kill_round: $line"
docker logs "$victim" 2>&1 | grep -q "$victim_id: round $kill_round uploaded" &&
  fail "$victim_id had already uploaded round $kill_round when it was killed; the kill was not mid-round"

# ---- the run finishes ----------------------------------------------------------------------
step "waiting for the coordinator to finish"
rc=$(timeout 420 docker wait "$coordinator") || { dump_logs; fail "the coordinator did not finish in 420 s"; }
[ "$rc" = 0 ] || { dump_logs; fail "the coordinator exited with $rc"; }
docker logs "$coordinator" 2>&1 | grep -E ' round +[0-9]+ ' | sed 's/^/    /'

# ---- 6. the history on the volume ------------------------------------------------------------
mkdir -p "$work/history"
docker run --rm --network none -v "${project}_history:/h:ro" --entrypoint tar "$image" -C /h -c . |
  tar -C "$work/history" -x || fail "could not copy the history volume"
db=$work/history/history.db
[ -s "$db" ] || fail "no history.db on the history volume"
q() { sqlite3 -batch -noheader "$db" "$1"; }
run=$(q "SELECT max(run_id) FROM runs;")
echo "    rounds (round|status|selected|completed|dropped|accuracy):"
q "SELECT round, status, selected, completed, dropped, printf('%.4f', test_accuracy)
   FROM rounds WHERE run_id = $run ORDER BY round;" | sed 's/^/      /'
echo "    round-$kill_round updates (client|partition|status):"
q "SELECT client_id, \"partition\", status FROM updates WHERE run_id = $run AND round = $kill_round
   ORDER BY client_id;" | sed 's/^/      /'

[ "$(q "SELECT count(*) FROM rounds WHERE run_id = $run AND round BETWEEN 1 AND 3 AND status = 'ok';")" = 3 ] ||
  fail "expected rounds 1-3 ok"
[ "$(q "SELECT count(*) FROM rounds WHERE run_id = $run;")" = 4 ] || fail "expected rounds 0-3 only"
[ "$(q "SELECT count(*) FROM clients;")" = 8 ] || fail "expected 8 clients in the history"
[ "$(q "SELECT group_concat(client_id, ' ') FROM (SELECT client_id FROM clients ORDER BY client_id);")" = \
  "client-1 client-2 client-3 client-4 client-5 client-6 client-7 client-8" ] ||
  fail "expected clients client-1..client-8, one identity per replica"
[ "$(q "SELECT count(*) FROM updates WHERE run_id = $run
        AND \"partition\" != CAST(substr(client_id, 8) AS INTEGER) - 1;")" = 0 ] ||
  fail "a client trained another partition than its identity's"
# Accuracy rising: every round above the initial model, the last one at least 20 points above
# it, and round 2 or 3 above round 1 (one round may dip: clients train 32 local epochs on skewed
# partitions, and which clients a round gets depends on timing).
acc=$(q "SELECT group_concat(test_accuracy, ' ') FROM (SELECT test_accuracy FROM rounds
         WHERE run_id = $run ORDER BY round);")
awk -v a="$acc" 'BEGIN { n = split(a, x, " ");
  ok = (n == 4 && x[4] >= x[1] + 0.20 && (x[3] > x[2] || x[4] > x[2]));
  for (i = 2; i <= n; ++i) if (x[i] <= x[1]) ok = 0; exit !ok }' ||
  fail "accuracy is not rising: $acc"
# The killed client: dropped in its round, which still completed with the others.
[ "$(q "SELECT status FROM updates WHERE run_id = $run AND round = $kill_round AND client_id = '$victim_id';")" = dropped ] ||
  fail "$victim_id's round-$kill_round update is not 'dropped'"
[ "$(q "SELECT dropped >= 1 AND completed >= 4 AND status = 'ok' FROM rounds
        WHERE run_id = $run AND round = $kill_round;")" = 1 ] ||
  fail "round $kill_round did not complete without $victim_id"
[ "$(q "SELECT count(*) FROM updates WHERE run_id = $run AND round > $kill_round AND client_id = '$victim_id';")" = 0 ] ||
  fail "$victim_id, killed, took part in a later round"

step "PASS: 3 rounds ok, 8 clients, accuracy $acc, $victim_id dropped in round $kill_round"
exit 0
