#!/bin/sh
# Installs those of the Debian packages listed in FILE (one a line) that the image lacks, then
# removes apt's lists again; does nothing (no apt-get update) when all are present. Used by the
# runtime stages of docker/Dockerfile with the list docker/runtime-packages.sh wrote.
set -eu
missing=""
for p in $(cat "$1"); do
  dpkg-query -W -f '${Status}\n' "$p" 2> /dev/null | grep -q ' installed$' || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
echo "install-missing-packages:$missing"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt/* /var/log/dpkg.log
