#!/usr/bin/env bash
# Builds the fedfleet CPU image both ways and reports what each costs:
#   source    docker/build.sh --source: -dev packages + compiling fedfleet inside Docker
#   prebuilt  docker/build.sh --prebuilt BINARY: the runtime stage around a host-built binary
#             (only with --binary; the baseline the source build is compared with)
# Each build runs with --no-cache, after the base image exists, so both pay for their own apt
# downloads. Uses the running Docker engine, or starts one under a temp dir (and stops it and
# deletes its data at the end), and creates debian:bookworm-slim when it is missing.
#
#   bench/docker_build.sh [--binary build/cli/fedfleet] [--jobs 2] [--keep-images]
#
# Last line: RESULT key=value ... (seconds, MiB); exits 0 when every build succeeded, else 1.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/docker/common.sh"

binary="" jobs=${JOBS:-2} keep=0
while (($#)); do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --keep-images) keep=1; shift ;;
    *) echo "docker_build: unknown argument $1" >&2; exit 2 ;;
  esac
done

work=$(mktemp -d "${TMPDIR:-/tmp}/ffb.XXXXXX")
tag_source=fedfleet-bench:source-$$ tag_prebuilt=fedfleet-bench:prebuilt-$$
finish() {
  if ((keep == 0)); then
    docker image rm -f "$tag_source" "$tag_prebuilt" > /dev/null 2>&1 || true
  fi
  fedfleet_engine_down "$work/engine"
  rm -rf "$work"
}
trap finish EXIT

if ! fedfleet_engine_up "$work/engine"; then
  echo "RESULT status=no_engine"
  exit 1
fi
if ! docker image inspect debian:bookworm-slim > /dev/null 2>&1; then
  "$root/docker/make-base-image.sh" || { echo "RESULT status=no_base_image"; exit 1; }
fi
base_mib=$(($(docker image inspect -f '{{.Size}}' debian:bookworm-slim) / 1048576))

# Prints the seconds a build took; its log goes to $work/<name>.log.
timed_build() {
  local name=$1
  shift
  local t=$(date +%s.%N)
  if ! "$root/docker/build.sh" "$@" --no-cache > "$work/$name.log" 2>&1; then
    tail -n 30 "$work/$name.log" >&2
    return 1
  fi
  awk -v a="$t" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }'
}
# "yes" when the image holds a -dev package or a compiler.
has_build_tools() {
  local found
  found=$(docker run --rm --network none --entrypoint sh "$1" -c \
    'dpkg-query -W -f "\${Package}\n" | grep -- "-dev$"; for c in gcc g++ cc c++ cpp; do command -v $c; done; true')
  [ -n "$found" ] && echo yes || echo no
}
mib() { echo $(($(docker image inspect -f '{{.Size}}' "$1") / 1048576)); }

status=0
echo "docker_build: from source (jobs $jobs) ..."
if source_s=$(timed_build source --source --jobs "$jobs" --tag "$tag_source"); then
  source_mib=$(mib "$tag_source")
  source_tools=$(has_build_tools "$tag_source")
  echo "docker_build: source build ${source_s} s, image ${source_mib} MiB, build tools: $source_tools"
  [ "$source_tools" = no ] || status=1
else
  source_s=fail source_mib=fail source_tools=unknown status=1
fi
result="source_build_s=$source_s source_image_mib=$source_mib source_has_build_tools=$source_tools"

if [ -n "$binary" ]; then
  echo "docker_build: from the host binary $binary ..."
  if prebuilt_s=$(timed_build prebuilt --prebuilt "$binary" --tag "$tag_prebuilt"); then
    prebuilt_mib=$(mib "$tag_prebuilt")
    echo "docker_build: prebuilt build ${prebuilt_s} s, image ${prebuilt_mib} MiB"
    ratio=$(awk -v a="$source_s" -v b="$prebuilt_s" 'BEGIN { if (b > 0 && a + 0 == a) printf "%.2f", a / b; else print "na" }')
  else
    prebuilt_s=fail prebuilt_mib=fail ratio=na status=1
  fi
  result+=" prebuilt_build_s=$prebuilt_s prebuilt_image_mib=$prebuilt_mib source_over_prebuilt_s=$ratio"
fi
echo "RESULT $result base_image_mib=$base_mib jobs=$jobs status=$([ $status = 0 ] && echo ok || echo fail)"
exit $status
