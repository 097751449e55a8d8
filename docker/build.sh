#!/usr/bin/env bash
# Builds the fedfleet CPU image from docker/Dockerfile, by either path:
#
#   docker/build.sh --source [--tag fedfleet:latest]
#       compile fedfleet inside Docker (target `runtime`); the build context is the repository's
#       own files (git ls-files: tracked and untracked-but-not-ignored), never build*/ or out/
#   docker/build.sh --prebuilt PATH/TO/fedfleet [--tag fedfleet:latest]
#       copy a binary built on this host (Debian bookworm, the image's release) into the
#       runtime stage (target `runtime-prebuilt`); the context is docker/ plus that one file
#   docker/build.sh --cuda [--tag fedfleet-cuda:latest]
#       the CUDA client image from docker/Dockerfile.cuda, from source; needs internet (NVIDIA's
#       apt repository, the LibTorch archive): never built on the project's own machines
#
# Options: --tag TAG, --jobs N (compile jobs, --source), --base IMAGE (default
# debian:bookworm-slim; docker/make-base-image.sh creates it where no registry is reachable),
# --no-cache. Builds use the host's Debian mirrors (DEBIAN_MIRROR / DEBIAN_SECURITY_MIRROR
# override them) and host networking, which also works on engines started with
# --bridge=none. Prints the image size last; exits non-zero when the build fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/common.sh"

mode="" binary="" tag="" dockerfile=docker/Dockerfile jobs=${JOBS:-2} base=debian:bookworm-slim
extra=()
while (($#)); do
  case "$1" in
    --source) mode=source; shift ;;
    --cuda) mode=source; dockerfile=docker/Dockerfile.cuda; shift ;;
    --prebuilt) mode=prebuilt; binary=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    --no-cache) extra+=(--no-cache); shift ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -z "$mode" ]; then
  echo "usage: docker/build.sh --source | --prebuilt PATH/TO/fedfleet | --cuda  [--tag TAG]" >&2
  exit 2
fi
if [ -z "$tag" ]; then
  [ "$dockerfile" = docker/Dockerfile ] && tag=fedfleet:latest || tag=fedfleet-cuda:latest
fi
build_args=()
[ "$mode" = source ] && build_args+=(--build-arg JOBS="$jobs" --build-arg PREBUILT_OPTIONAL=1)
fedfleet_debian_mirrors

ctx=$(mktemp -d "${TMPDIR:-/tmp}/fedfleet-context.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
if [ "$mode" = prebuilt ]; then
  [ -x "$binary" ] || { echo "build.sh: $binary is not an executable" >&2; exit 2; }
  target=runtime-prebuilt
  mkdir -p "$ctx/docker" "$ctx/prebuilt"
  cp "$here/Dockerfile" "$here/entrypoint.sh" "$here/install-missing-packages.sh" \
    "$here/fedfleet.toml" "$ctx/docker/"
  cp "$binary" "$ctx/prebuilt/fedfleet"
  chmod 755 "$ctx/prebuilt/fedfleet" "$ctx/docker/entrypoint.sh" "$ctx/docker/install-missing-packages.sh"
  "$here/runtime-packages.sh" "$binary" > "$ctx/prebuilt/runtime-packages.txt" ||
    { echo "build.sh: cannot tell which packages $binary needs" >&2; exit 1; }
  tar -C "$ctx" -cf "$ctx.tar" docker prebuilt
else
  target=runtime
  if git -C "$root" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    (cd "$root" && git ls-files -z --cached --others --exclude-standard |
      while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
      tar --null -T - -cf "$ctx.tar")
  else
    tar -C "$root" --exclude='./build*' --exclude=./out --exclude=./.git -cf "$ctx.tar" .
  fi
fi
trap 'rm -rf "$ctx" "$ctx.tar"' EXIT
echo "build.sh: $mode build of $tag (target $target, context $(du -h "$ctx.tar" | cut -f1)," \
  "mirror $DEBIAN_MIRROR)"

docker build --network host -f "$dockerfile" --target "$target" -t "$tag" \
  --build-arg BASE_IMAGE="$base" "${build_args[@]}" \
  --build-arg DEBIAN_MIRROR="$DEBIAN_MIRROR" \
  --build-arg DEBIAN_SECURITY_MIRROR="$DEBIAN_SECURITY_MIRROR" \
  "${extra[@]}" - < "$ctx.tar"

bytes=$(docker image inspect -f '{{.Size}}' "$tag")
echo "build.sh: $tag is $((bytes / 1024 / 1024)) MiB"
