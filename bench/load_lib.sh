# Shared by the benchmarks that drive a real coordinator with the load client
# (bench/load_client.cc: many fake clients in one process): `source bench/load_lib.sh` from the
# repository root, after bench/lib.sh. Sets LOAD_CLIENT ($BUILD_DIR/fedfleet_load_client, built
# when missing), checks the Fashion-MNIST files the coordinator evaluates on, and defines:
#   load_need_files N          raise the open-files limit to its hard limit; exit 1 below N
#   load_start_coordinator D A start `fedfleet coordinator` (CURVE, 127.0.0.1, keys D/keys, history
#                              D/h.db, log D/coordinator.log, peak RSS in KiB to D/peak_kib by
#                              /usr/bin/time) with the extra flags A...; sets COORD_PID (the
#                              time process) and ENDPOINT
#   load_coordinator_pid       the coordinator's own pid (the child of COORD_PID)
#   load_start_client D A      start the load client with flags A... (output D/load.log); sets
#                              LOAD_PID
#   load_stop_client           SIGTERM the load client and wait; its exit status in LOAD_RC
#   load_wait_coordinator S    wait up to S seconds for the coordinator (then SIGTERM it); its
#                              exit status in COORD_RC
#   load_wait_round DB N S     wait up to S seconds until the history DB holds round N (the
#                              coordinator's log lags: it is not flushed line by line)
#   load_vm_kib PID FIELD      VmRSS / VmHWM of PID in KiB (0 when gone)
#   load_median                median of the numbers on stdin
# The EXIT trap (load_cleanup) stops what is still running, by pid, and removes WORK unless
# KEEP_WORK=1.
LOAD_CLIENT="$(pwd)/$BUILD_DIR/fedfleet_load_client"
if [ ! -x "$LOAD_CLIENT" ]; then
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$BUILD_DIR" -j2 --target fedfleet_load_client
fi
LOAD_DATA_DIR=${FEDFLEET_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if ! ls "$LOAD_DATA_DIR"/t10k-images-idx3-ubyte* > /dev/null 2>&1; then
  echo "no Fashion-MNIST test set in $LOAD_DATA_DIR: install the Debian package" \
    "dataset-fashion-mnist (scripts/install-deps.sh) or set FEDFLEET_FASHION_MNIST_DIR" >&2
  exit 1
fi
COORD_PID=""
LOAD_PID=""
ENDPOINT=""

load_cleanup() {
  for p in $LOAD_PID $COORD_PID; do kill "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  if [ "${KEEP_WORK:-0}" = 1 ]; then echo "work files kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap load_cleanup EXIT

load_need_files() {
  ulimit -n "$(ulimit -Hn)" 2> /dev/null || true
  local have
  have=$(ulimit -n)
  if [ "$have" != unlimited ] && [ "$have" -lt "$1" ]; then
    echo "open files limit $have is below the $1 this run needs (ulimit -n)" >&2
    exit 1
  fi
}

load_start_coordinator() {
  local dir=$1
  shift
  /usr/bin/time -f "%M" -o "$dir/peak_kib" "$FEDFLEET" coordinator --keys "$dir/keys" \
    --bind 'tcp://127.0.0.1:*' --endpoint-file "$dir/endpoint" --db "$dir/h.db" \
    --data-dir "$LOAD_DATA_DIR" "$@" > "$dir/coordinator.log" 2>&1 &
  COORD_PID=$!
  for _ in $(seq 1 600); do
    [ -s "$dir/endpoint" ] && break
    kill -0 "$COORD_PID" 2> /dev/null || break
    sleep 0.1
  done
  if [ ! -s "$dir/endpoint" ]; then
    echo "the coordinator did not start:" >&2
    tail -20 "$dir/coordinator.log" >&2
    exit 1
  fi
  ENDPOINT=$(cat "$dir/endpoint")
}

load_coordinator_pid() { pgrep -P "$COORD_PID" | head -1; }

load_start_client() {
  local dir=$1
  shift
  "$LOAD_CLIENT" --coordinator "$ENDPOINT" --keys "$dir/keys" "$@" > "$dir/load.log" 2>&1 &
  LOAD_PID=$!
}

load_stop_client() {
  LOAD_RC=0
  kill -TERM "$LOAD_PID" 2> /dev/null || true
  wait "$LOAD_PID" || LOAD_RC=$?
  LOAD_PID=""
}

load_wait_coordinator() {
  local until=$((SECONDS + $1))
  COORD_RC=0
  while kill -0 "$COORD_PID" 2> /dev/null && [ "$SECONDS" -lt "$until" ]; do sleep 0.2; done
  if kill -0 "$COORD_PID" 2> /dev/null; then
    echo "the coordinator did not finish within $1 s; stopping it" >&2
    kill -TERM "$COORD_PID" 2> /dev/null || true
  fi
  wait "$COORD_PID" || COORD_RC=$?
  COORD_PID=""
}

load_wait_round() {
  local db=$1 round=$2 until=$((SECONDS + $3)) last
  while [ "$SECONDS" -lt "$until" ]; do
    last=$(sqlite3 -cmd ".timeout 1000" "$db" "SELECT MAX(round) FROM rounds" 2> /dev/null || true)
    [ -n "$last" ] && [ "$last" -ge "$round" ] && return 0
    kill -0 "$COORD_PID" 2> /dev/null || return 1
    sleep 0.02
  done
  return 1
}

load_vm_kib() {
  local kib
  kib=$(awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status" 2> /dev/null || true)
  echo "${kib:-0}"
}

load_median() {
  sort -g | awk '{a[NR] = $1} END {if (NR == 0) {print "nan"; exit}
                                    if (NR % 2) print a[(NR + 1) / 2];
                                    else print (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
