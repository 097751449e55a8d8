#!/bin/sh
# Prints, one a line, the Debian packages that hold the shared libraries BINARY links directly
# (its NEEDED entries, resolved by ldd), e.g. libzmq5 for libzmq.so.5. Run where BINARY was
# built (the host for the prebuilt path, the build stage for the source path); the runtime
# stages install what the runtime image lacks, so a library added to fedfleet later needs no
# edit here. Libraries under a --skip PREFIX (say, a LibTorch unpacked in /opt) are left out.
# Exits 1 when a library cannot be resolved or belongs to no package.
#   docker/runtime-packages.sh [--skip PREFIX ...] build/cli/fedfleet
set -eu
skip=""
while [ $# -gt 1 ]; do
  case "$1" in
    --skip) skip="$skip $2"; shift 2 ;;
    *) break ;;
  esac
done
bin=$1
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p')
resolved=$(ldd "$bin")
status=0
found=""
for lib in $needed; do
  # "libx.so.1 => /path (addr)"; the dynamic loader (NEEDED by programs that link the static
  # CUDA runtime) shows as "/lib64/ld-linux-x86-64.so.2 (addr)" instead.
  path=$(printf '%s\n' "$resolved" | awk -v l="$lib" '
    $1 == l && $2 == "=>" { print $3; exit }
    substr($1, 1, 1) == "/" && substr($1, length($1) - length(l)) == "/" l { print $1; exit }')
  if [ -z "$path" ] || [ "$path" = "not" ]; then
    echo "runtime-packages: $lib is not found by ldd" >&2
    status=1
    continue
  fi
  real=$(readlink -f "$path")
  skipped=""
  for prefix in $skip; do
    case "$path" in "$prefix"*) skipped=1 ;; esac
    case "$real" in "$prefix"*) skipped=1 ;; esac
  done
  [ -z "$skipped" ] || continue
  pkg=""
  # dpkg knows a file by the path its package ships it at: /lib/... or /usr/lib/... (merged /usr).
  for p in "$path" "/usr${path#/usr}" "${path#/usr}" "$real"; do
    pkg=$(dpkg -S "$p" 2> /dev/null | head -n 1 | sed 's/: .*//; s/:.*//') || true
    [ -n "$pkg" ] && break
  done
  if [ -z "$pkg" ]; then
    echo "runtime-packages: no package holds $path" >&2
    status=1
    continue
  fi
  found="$found $pkg"
done
printf '%s\n' $found | sort -u
exit $status
