#!/usr/bin/env bash
# Installs the Debian packages fedfleet needs, for what is about to be done:
#   install-deps.sh build   what building fedfleet needs (compiler, CMake, the -dev libraries)
#   install-deps.sh data    the Fashion-MNIST data set (dataset-fashion-mnist)
#   install-deps.sh demo    build + data: scripts/demo.sh and scripts/demo_processes.sh
#   install-deps.sh python  build + what the Python package needs (pybind11, Python headers,
#                           PyTorch, pandas, tqdm; pytest for its tests)
#   install-deps.sh all     (the default) demo + python + what the tests, benchmarks and fuzzers need:
#                           clang, Chromium (the report's browser test), Docker, Python with
#                           PyTorch (baselines and the export example)
# Several may be given. Idempotent: when every package is present it only checks and returns.
set -euo pipefail

# Docker's build stage (docker/Dockerfile, docker/Dockerfile.cuda) reads this list.
BUILD_PACKAGES=(
  build-essential g++ cmake pkg-config ccache git
  libzmq3-dev cppzmq-dev libsodium-dev
  capnproto libcapnp-dev
  libtorch-dev libopenblas0-openmp
  libopenmpi-dev openmpi-bin
  libssl-dev libsqlite3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libspdlog-dev libfmt-dev libtomlplusplus-dev nlohmann-json3-dev
  libcpp-httplib-dev prometheus-cpp-dev zlib1g-dev libcsv-dev libpng-dev libjpeg62-turbo-dev
)
PYTHON_PACKAGES=(
  pybind11-dev python3-dev python3-torch python3-numpy python3-pandas python3-tqdm
  python3-pytest python3-matplotlib
)
DATA_PACKAGES=(
  dataset-fashion-mnist
)
TEST_PACKAGES=(
  clang libclang-rt-14-dev llvm
  sqlite3 procps time bsdutils curl
  python3-torch python3-numpy python3-torchvision python3-pil python3-mpmath
  chromium
  docker.io docker-compose debootstrap
)

want=()
groups=("$@")
((${#groups[@]})) || groups=(all)
for g in "${groups[@]}"; do
  case "$g" in
    build) want+=("${BUILD_PACKAGES[@]}") ;;
    data) want+=("${DATA_PACKAGES[@]}") ;;
    demo) want+=("${BUILD_PACKAGES[@]}" "${DATA_PACKAGES[@]}") ;;
    python) want+=("${BUILD_PACKAGES[@]}" "${PYTHON_PACKAGES[@]}") ;;
    all) want+=("${BUILD_PACKAGES[@]}" "${DATA_PACKAGES[@]}" "${PYTHON_PACKAGES[@]}"
                "${TEST_PACKAGES[@]}") ;;
    *)
      echo "install-deps: unknown group '$g' (build, data, demo, python, all)" >&2
      exit 2
      ;;
  esac
done

missing=()
for p in "${want[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#want[@]} packages present (${groups[*]})"
  exit 0
fi

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
