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
