#!/usr/bin/env bash
# Fetches, on a Debian machine, the .deb files scripts/gpu_check.sh unpacks on a GPU machine that
# lacks them (GoogleTest's static libraries and headers), into DEBS (default .device-debs, which
# git ignores). Needs apt's package lists (apt-get update) but no root.
set -euo pipefail
cd "$(dirname "$0")/.."
DEBS=${DEBS:-.device-debs}
mkdir -p "$DEBS"
cd "$DEBS"
apt-get download libgtest-dev libgmock-dev
ls -l
