#!/usr/bin/env bash
# Installs every Debian package fedfleet needs to build, test and run.
# Idempotent: when all packages are present it only checks and returns.
set -euo pipefail

PACKAGES=(
  build-essential g++ cmake pkg-config ccache git
  clang libclang-rt-14-dev llvm
  libzmq3-dev cppzmq-dev libsodium-dev
  capnproto libcapnp-dev
  libtorch-dev libopenblas0-openmp
  libopenmpi-dev openmpi-bin
  libssl-dev libsqlite3-dev sqlite3
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libspdlog-dev libfmt-dev libtomlplusplus-dev nlohmann-json3-dev
  libcpp-httplib-dev prometheus-cpp-dev zlib1g-dev libcsv-dev libpng-dev libjpeg62-turbo-dev
  dataset-fashion-mnist
  python3-torch python3-numpy python3-torchvision python3-pil python3-mpmath
  procps time bsdutils
  chromium
  docker.io docker-compose debootstrap
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
