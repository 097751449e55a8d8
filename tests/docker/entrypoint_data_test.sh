#!/bin/bash
# docker/entrypoint.sh's client role with per-replica data, without Docker: a stand-in
# `fedfleet` on PATH prints the command line the entrypoint builds. The replica that claims
# client-1 gets data.path (and data.test_path) inside <root>/client-1/ and no --partition; without
# FEDFLEET_DATA_FILE it trains partition 0; a missing file stops it with status 3 naming the path.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

mkdir -p "$tmp/bin" "$tmp/keys" "$tmp/data/client-1" "$tmp/cache"
printf '#!/bin/sh\nprintf "%%s\\n" "$@"\n' > "$tmp/bin/fedfleet"
chmod +x "$tmp/bin/fedfleet"
: > "$tmp/keys/client-1.key_secret"
: > "$tmp/keys/client-2.key_secret"
echo "f0,label" > "$tmp/data/client-1/train.csv"
echo "f0,label" > "$tmp/data/client-1/test.csv"

run() {
  env PATH="$tmp/bin:$PATH" FEDFLEET_KEYS_DIR="$tmp/keys" FEDFLEET_CACHE_DIR="$tmp/cache" \
    FEDFLEET_DATA_ROOT="$tmp/data" "$@" bash "$root/docker/entrypoint.sh" client
}

out=$(run FEDFLEET_DATA_FILE=train.csv FEDFLEET_DATA_TEST_FILE=test.csv 2> "$tmp/err")
grep -qx -- "client-1" <<< "$out" || fail "no --id client-1 in: $out"
grep -qx -- "data.path=$tmp/data/client-1/train.csv" <<< "$out" || fail "no data.path in: $out"
grep -qx -- "data.test_path=$tmp/data/client-1/test.csv" <<< "$out" ||
  fail "no data.test_path in: $out"
! grep -qx -- "--partition" <<< "$out" || fail "a client of its own data got a partition: $out"

out=$(run 2> "$tmp/err")
grep -qx -- "--partition" <<< "$out" || fail "no --partition without own data: $out"
grep -A1 -x -- "--partition" <<< "$out" | grep -qx 0 || fail "client-1 should train partition 0"
! grep -q "data.path" <<< "$out" || fail "data.path without FEDFLEET_DATA_FILE: $out"

rm "$tmp/data/client-1/train.csv"
set +e
run FEDFLEET_DATA_FILE=train.csv > "$tmp/out" 2> "$tmp/err"
rc=$?
set -e
[ "$rc" = 3 ] || fail "a missing data file exited $rc, not 3"
grep -q "$tmp/data/client-1/train.csv" "$tmp/err" || fail "the error does not name the file: $(cat "$tmp/err")"
echo "entrypoint data: ok"
