# Sourced by scripts/demo.sh and scripts/demo_processes.sh: sets FEDFLEET to the fedfleet
# program to run, installing only what that needs.
#   FEDFLEET   an existing fedfleet program: used as it is (only the data set is installed)
#   BUILD_DIR  otherwise, the build directory (default build; relative to the repository, or
#              absolute): fedfleet is built there, then installed into PREFIX
#   PREFIX     where the build is installed (default /usr/local, so that `fedfleet` is on PATH;
#              empty: not installed)
#   JOBS       parallel compile jobs (default 2)
# Expects ROOT (the repository) and the working directory to be the repository.
if [ -n "${FEDFLEET:-}" ]; then
  if ! found=$(command -v "$FEDFLEET"); then
    echo "FEDFLEET=$FEDFLEET: no such program" >&2
    exit 2
  fi
  FEDFLEET=$(readlink -f "$found")
  ./scripts/install-deps.sh data
  if ! "$FEDFLEET" --version > /dev/null; then
    echo "FEDFLEET=$FEDFLEET does not run here (a library missing? see the lines above)" >&2
    exit 2
  fi
else
  ./scripts/install-deps.sh demo
  BUILD_DIR=${BUILD_DIR:-build}
  case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$ROOT/$BUILD_DIR" ;; esac
  cmake -S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$BUILD_DIR" -j"${JOBS:-2}" --target fedfleet
  FEDFLEET="$BUILD_DIR/cli/fedfleet"
  PREFIX=${PREFIX-/usr/local}
  if [ -n "$PREFIX" ]; then
    SUDO=""
    if [ "$(id -u)" != 0 ] && ! [ -w "$PREFIX/bin" ]; then SUDO=sudo; fi
    if $SUDO cmake --install "$BUILD_DIR" --prefix "$PREFIX" --component fedfleet > /dev/null; then
      echo "installed: $PREFIX/bin/fedfleet"
      case ":$PATH:" in
        *":$PREFIX/bin:"*) ;;
        *) echo "put it on PATH: export PATH=\"$PREFIX/bin:\$PATH\"" ;;
      esac
    else
      echo "not installed into $PREFIX; put it on PATH: export PATH=\"$BUILD_DIR/cli:\$PATH\""
    fi
  fi
fi

# output_folder NAME: OUT, unless set, becomes out/NAME-<date-time> in the repository; the
# folder is created and OUT made absolute.
output_folder() {
  OUT=${OUT:-"$ROOT/out/$1-$(date +%Y%m%d-%H%M%S)"}
  mkdir -p "$OUT"
  OUT=$(cd "$OUT" && pwd)
}
