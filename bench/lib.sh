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

# The Python package in $BUILD_DIR/python (PYTHONPATH), built (after installing its Debian
# packages) when it is not there yet.
ensure_python_package() {
  if [ ! -f "$BUILD_DIR/python/fedfleet/__init__.py" ] || ! ls "$BUILD_DIR"/python/fedfleet/_core*.so > /dev/null 2>&1; then
    ./scripts/install-deps.sh python
    cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
    cmake --build "$BUILD_DIR" -j2 --target fedfleet_python
  fi
}
