#!/usr/bin/env bash
# Creates the `debian:bookworm-slim` base image locally, for engines that cannot pull from a
# registry: debootstrap (minbase variant) from this host's Debian mirror, trimmed the way the
# official slim image is (no docs, man pages or locales, no apt lists or caches, and a dpkg
# filter that keeps later installs slim too), then `docker import`. About 30-40 s. Needs root
# and the debootstrap package.
#
#   docker/make-base-image.sh [--tag debian:bookworm-slim] [--mirror URL] [--cache FILE.tar]
#
# --cache FILE: import FILE when it exists instead of running debootstrap; otherwise save the
# new root file system there for next time. DEBIAN_MIRROR overrides the mirror too.
# Exits 0 when the image exists afterwards.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/common.sh"

tag=debian:bookworm-slim
cache=""
while (($#)); do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --mirror) DEBIAN_MIRROR=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    *) echo "make-base-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
fedfleet_debian_mirrors

if [ -n "$cache" ] && [ -s "$cache" ]; then
  echo "make-base-image: importing $cache as $tag"
  docker import --change 'CMD ["bash"]' "$cache" "$tag" > /dev/null
  exit 0
fi

command -v debootstrap > /dev/null || { echo "make-base-image: debootstrap is not installed" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "make-base-image: debootstrap needs root" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/fedfleet-rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
echo "make-base-image: debootstrap bookworm from $DEBIAN_MIRROR"
if ! debootstrap --variant=minbase bookworm "$root" "$DEBIAN_MIRROR" > "$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
fi

# What the official slim image does: keep docs, man pages and locales out of every install.
cat > "$root/etc/dpkg/dpkg.cfg.d/docker-slim" << 'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
cat > "$root/etc/apt/apt.conf.d/docker-clean" << 'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache ""; Dir::Cache::srcpkgcache "";
EOF
cat > "$root/etc/apt/apt.conf.d/docker-no-recommends" << 'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
# The same sources layout as the official image; image builds replace it with their own mirror.
rm -f "$root/etc/apt/sources.list"
cat > "$root/etc/apt/sources.list.d/debian.sources" << EOF
Types: deb
URIs: $DEBIAN_MIRROR
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $DEBIAN_SECURITY_MIRROR
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
rm -rf "$root"/usr/share/{man,info,groff,lintian,linda}/* "$root"/var/cache/apt/* \
  "$root"/var/lib/apt/lists/* "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/*
find "$root/usr/share/locale" -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +

if [ -n "$cache" ]; then
  mkdir -p "$(dirname "$cache")"
  tar --numeric-owner -C "$root" -cf "$cache.tmp" . && mv "$cache.tmp" "$cache"
  docker import --change 'CMD ["bash"]' "$cache" "$tag" > /dev/null
else
  tar --numeric-owner -C "$root" -c . | docker import --change 'CMD ["bash"]' - "$tag" > /dev/null
fi
echo "make-base-image: $tag created ($(du -sh --apparent-size "$root" | cut -f1) root file system)"
