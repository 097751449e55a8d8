#!/bin/bash
# Entrypoint of the fedfleet images: turns the container's environment into a `fedfleet`
# command line, so compose services need no per-replica editing.
#
#   keygen        write the coordinator key pair and client-1..client-N (N = FEDFLEET_CLIENTS),
#                 only those missing, split over two directories: KEYS_OUT/coordinator (the
#                 coordinator pair + the allow-list clients/*.key) and KEYS_OUT/clients (every
#                 client pair + the coordinator's public key; no coordinator secret)
#   coordinator   run the coordinator; after a container restart it resumes the run
#   client        claim a free client identity (see below) and run that client
#   anything else passed to `fedfleet` as is (`history --db ...`, `--help`)
# Arguments after the role are appended to the fedfleet command line.
#
# A client replica claims identity client-i by holding an exclusive flock(1) on
# claims/client-i.lock in the keys directory, trying i = 1, 2, ... in order, for as long as its
# process lives; the kernel drops the lock when the container dies, so a replacement (or the
# same container restarted) takes the identity over. Identity i trains partition i-1 (the
# coordinator assigns one instead when there are fewer partitions). FEDFLEET_CLIENT_ID skips the
# claim and uses that id (one client per host, keys copied by hand).
#
# Environment (docker/fedfleet.env documents it for compose):
#   FEDFLEET_COORDINATOR_HOST/PORT  where clients connect (127.0.0.1:7700)
#   FEDFLEET_BIND_HOST              the coordinator's listening address (127.0.0.1; 0.0.0.0 for
#                                   clients on other hosts)
#   FEDFLEET_CLIENTS                client identities keygen writes, and data.partitions
#   FEDFLEET_CONFIG                 the TOML job (/etc/fedfleet/fedfleet.toml)
#   FEDFLEET_KEYS_DIR               /var/lib/fedfleet/keys
#   FEDFLEET_KEYS_OUT               keygen's output root (/var/lib/fedfleet/keygen)
#   FEDFLEET_HISTORY_DB             /var/lib/fedfleet/history/history.db
#   FEDFLEET_CLIENT_ID              fixed client id (no claim)
#   FEDFLEET_SET                    extra "section.key=value" overrides, space-separated
#   FEDFLEET_DATA_FILE              clients with their own data: the file in <root>/<id>/ each
#   FEDFLEET_DATA_TEST_FILE         replica trains, and its held-out file (optional); root is
#   FEDFLEET_DATA_ROOT              /var/lib/fedfleet/data (compose mounts FEDFLEET_DATA_DIR)
set -euo pipefail

config=${FEDFLEET_CONFIG:-/etc/fedfleet/fedfleet.toml}
keys=${FEDFLEET_KEYS_DIR:-/var/lib/fedfleet/keys}
host=${FEDFLEET_COORDINATOR_HOST:-127.0.0.1}
port=${FEDFLEET_COORDINATOR_PORT:-7700}
bind_host=${FEDFLEET_BIND_HOST:-127.0.0.1}
clients=${FEDFLEET_CLIENTS:-}
db=${FEDFLEET_HISTORY_DB:-/var/lib/fedfleet/history/history.db}

log() { echo "fedfleet-entrypoint: $*" >&2; }

overrides=()
for kv in ${FEDFLEET_SET:-}; do overrides+=(--set "$kv"); done

role=${1:---help}
[ $# -gt 0 ] && shift

case "$role" in
  keygen)
    out=${FEDFLEET_KEYS_OUT:-/var/lib/fedfleet/keygen}
    n=${clients:-1}
    mkdir -p "$out/coordinator/clients" "$out/clients"
    tmp=$(mktemp -d)
    args=()
    pairs=0
    [ -s "$out/coordinator/coordinator.key_secret" ] || { args+=(--coordinator); pairs=$((pairs + 1)); }
    for i in $(seq 1 "$n"); do
      [ -s "$out/clients/client-$i.key_secret" ] || { args+=(--name "client-$i"); pairs=$((pairs + 1)); }
    done
    if ((${#args[@]} == 0)); then
      log "keys for the coordinator and $n clients already exist; nothing to do"
      exit 0
    fi
    fedfleet keygen --dir "$tmp" "${args[@]}" "$@" > /dev/null
    if [ -e "$tmp/coordinator.key" ]; then
      cp -p "$tmp/coordinator.key" "$tmp/coordinator.key_secret" "$out/coordinator/"
    fi
    cp -p "$out/coordinator/coordinator.key" "$out/clients/"
    for f in "$tmp"/client-*.key; do
      [ -e "$f" ] || continue
      name=$(basename "$f" .key)
      cp -p "$tmp/$name.key" "$tmp/$name.key_secret" "$out/clients/"
      cp -p "$tmp/$name.key" "$out/coordinator/clients/"
    done
    rm -rf "$tmp"
    log "wrote $pairs key pair(s); coordinator allow-list holds $(ls "$out/coordinator/clients" | wc -l) client keys"
    ;;

  coordinator)
    extra=()
    if [ -n "$clients" ]; then
      extra+=(--set "data.partitions=$clients")
    fi
    # The container's own file system survives a restart of the same container (restart
    # policy), not a new container: a restarted coordinator continues its run.
    marker=/tmp/.fedfleet-coordinator-started
    if [ -e "$marker" ] && [ -s "$db" ]; then
      # Resume only a run that has committed a training round (round 1 writes the first
      # checkpoint); a run that died before that starts again as a new run.
      if fedfleet history --db "$db" --format csv 2> /dev/null | awk -F, '
          NR == 1 { for (i = 1; i <= NF; i++) if ($i == "round") col = i; next }
          col && $col >= 1 { found = 1 } END { exit !found }'; then
        log "restarted: resuming the latest run in $db"
        extra+=(--resume)
      else
        log "restarted before the run committed a round: starting a new run"
      fi
    fi
    touch "$marker"
    mkdir -p "$(dirname "$db")"
    log "coordinator on tcp://$bind_host:$port, history $db"
    exec fedfleet coordinator --config "$config" --bind "tcp://$bind_host:$port" --keys "$keys" \
      --db "$db" "${extra[@]}" "${overrides[@]}" "$@"
    ;;

  client)
    id=${FEDFLEET_CLIENT_ID:-}
    extra=()
    part=
    if [ -z "$id" ]; then
      mkdir -p "$keys/claims" 2> /dev/null || true
      # Identities present in the key directory, in numeric order.
      mapfile -t ids < <(cd "$keys" && ls client-*.key_secret 2> /dev/null |
        sed -n 's/^client-\([0-9][0-9]*\)\.key_secret$/\1/p' | sort -n)
      for i in "${ids[@]}"; do
        exec {lock_fd}> "$keys/claims/client-$i.lock"
        if flock -n "$lock_fd"; then
          id=client-$i
          part=$((i - 1))
          break
        fi
        exec {lock_fd}>&-
      done
      if ((${#ids[@]} == 0)); then
        log "no client key pairs (client-<i>.key_secret) in $keys: run keygen, or copy pairs in"
        exit 3
      elif [ -z "$id" ]; then
        log "all ${#ids[@]} client identities in $keys are claimed: raise FEDFLEET_CLIENTS and rerun keygen"
        exit 3
      fi
      # The lock stays held by the open descriptor, which fedfleet inherits through exec.
    fi
    # One cache directory per identity (the claim guarantees one live process per identity,
    # hence per directory). The image cache writes under a unique temporary name and renames,
    # so one shared directory would also be safe (docs/DEPLOY.md, "Known limits").
    export FEDFLEET_CACHE_DIR="${FEDFLEET_CACHE_DIR:-/var/cache/fedfleet}/$id"
    mkdir -p "$FEDFLEET_CACHE_DIR"
    # Each replica's own data: FEDFLEET_DATA_FILE names a file inside the replica's directory of
    # the data mount (/var/lib/fedfleet/data/<id>/), e.g. train.csv; FEDFLEET_DATA_TEST_FILE its
    # held-out file for federated evaluation. The job file then says data.format and
    # data.partition = "none".
    if [ -n "${FEDFLEET_DATA_FILE:-}" ]; then
      own="${FEDFLEET_DATA_ROOT:-/var/lib/fedfleet/data}/$id"
      if [ ! -e "$own/$FEDFLEET_DATA_FILE" ]; then
        log "client $id: no $own/$FEDFLEET_DATA_FILE: put this client's data in <FEDFLEET_DATA_DIR>/$id/ on the host"
        exit 3
      fi
      extra+=(--set "data.path=$own/$FEDFLEET_DATA_FILE")
      if [ -n "${FEDFLEET_DATA_TEST_FILE:-}" ]; then
        extra+=(--set "data.test_path=$own/$FEDFLEET_DATA_TEST_FILE")
      fi
    elif [ -n "$part" ]; then
      extra+=(--partition "$part")  # a client of its own files trains all of them instead
    fi
    log "client $id -> tcp://$host:$port"
    exec fedfleet client --config "$config" --coordinator "tcp://$host:$port" --id "$id" \
      --keys "$keys" "${extra[@]}" "${overrides[@]}" "$@"
    ;;

  *)
    exec fedfleet "$role" "$@"
    ;;
esac
