# Shared by the benchmarks that run the fedfleet program: `source bench/lib.sh` from the repository root.
# Sets FEDFLEET to $BUILD_DIR/cli/fedfleet (BUILD_DIR default: build), building it (after
# installing the Debian packages) when it is not there yet.
BUILD_DIR=${BUILD_DIR:-build}
FEDFLEET="$(pwd)/$BUILD_DIR/cli/fedfleet"
if [ ! -x "$FEDFLEET" ]; then
  ./scripts/install-deps.sh
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$BUILD_DIR" -j2 --target fedfleet
fi

# The Python baselines multiply on the OpenBLAS kernels fedfleet's training runs on: fedfleet
# corrects OpenBLAS's choice on a CPU OpenBLAS does not recognise (docs/ARCHITECTURE.md), and a
# ratio against a loop left on the slower kernels would measure that, not the two programs.
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  blas_core=$("$FEDFLEET" --blas-core 2> /dev/null || true)
  if [ -n "$blas_core" ]; then export OPENBLAS_CORETYPE="$blas_core"; fi
fi

# The Python package in $BUILD_DIR/python (PYTHONPATH), built (after installing its Debian
# packages) when it is not there yet.
ensure_python_package() {
  if [ ! -f "$BUILD_DIR/python/fedfleet/__init__.py" ] || ! ls "$BUILD_DIR"/python/fedfleet/_core*.so > /dev/null 2>&1; then
    ./scripts/install-deps.sh python
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
    cmake --build "$BUILD_DIR" -j2 --target fedfleet_python
  fi
}
