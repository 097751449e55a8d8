#!/usr/bin/env bash
# Bring your own data: one epoch of loading a folder of 60,000 PNG files (Fashion-MNIST's
# training set written as root/<label>/NNNNN.png, 28x28 grey) with fedfleet's image-folder
# reader against torchvision's ImageFolder + DataLoader, in the same run.
#
# fedfleet (bench/byo_data.cc): data.format = "image-folder"'s reader (common/data/image_folder.h)
# lists the folder and decodes every file with libpng on one thread per core, then
# common/model/batch.h's BatchBuilder builds float batches of 64 in file order.
# Baseline (bench/baselines/imagefolder_torchvision.py, Debian's python3-torchvision):
# ImageFolder with Grayscale(1) + ToTensor, DataLoader(batch_size=64) in file order, with 1 and
# with 2 worker processes; the faster counts. Both read and decode every PNG file; the folder is
# written once (cached under $BUILD_DIR/byo_data, reruns skip it), so both read it from the page
# cache. An epoch is timed from before the listing to the last batch, process start-up excluded.
#
# Figures: the median epoch of RUNS runs each; ratio = imagefolder_s / torchvision_s.
# Goal: ratio <= 0.5. Exit 0 when met, else 1. Last line:
#   RESULT imagefolder_s=... torchvision_s=... ratio=...
# Environment: BUILD_DIR (default build), RUNS (3), WORKERS (the DataLoader worker counts
# tried, "1 2").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
RUNS=${RUNS:-3}
WORKERS=${WORKERS:-1 2}
FASHION_MNIST_DIR=${FEDFLEET_FASHION_MNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  ./scripts/install-deps.sh
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$BUILD_DIR" -j2 --target bench_byo_data > /dev/null
BENCH="$BUILD_DIR/bench_byo_data"
LOG=$(mktemp /tmp/byo_data.XXXXXX)
trap 'rm -f "$LOG"' EXIT
field() { sed -n "s/^RESULT .*$1=\([0-9.e+-]*\).*/\1/p"; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

ROOT="$BUILD_DIR/byo_data/fashion-mnist-png"
if [ ! -f "$ROOT.complete" ]; then
  echo "== writing 60,000 PNG files to $ROOT" >&2
  rm -rf "$ROOT" "$ROOT.complete"
  "$BENCH" write "$FASHION_MNIST_DIR" "$ROOT"
  touch "$ROOT.complete"
fi
files=$(find "$ROOT" -name '*.png' | wc -l)
[ "$files" = 60000 ] || { echo "byo_data: $ROOT holds $files PNG files, not 60000" >&2; exit 1; }

echo "== fedfleet image-folder reader + BatchBuilder, $RUNS epochs" >&2
fedfleet_runs=()
for ((i = 0; i < RUNS; i++)); do
  line=$("$BENCH" load "$ROOT")
  echo "   $line" >&2
  fedfleet_runs+=("$(field epoch_s <<< "$line")")
  fedfleet_labels=$(field label_sum <<< "$line")
done
imagefolder_s=$(printf '%s\n' "${fedfleet_runs[@]}" | median)

torchvision_s=""
for w in $WORKERS; do
  echo "== torchvision ImageFolder + DataLoader, $w workers, $RUNS epochs" >&2
  runs=()
  for ((i = 0; i < RUNS; i++)); do
    line=$(/usr/bin/python3 bench/baselines/imagefolder_torchvision.py "$ROOT" --workers "$w" \
      2> "$LOG") || { cat "$LOG" >&2; exit 1; }
    echo "   $line" >&2
    runs+=("$(field epoch_s <<< "$line")")
    labels=$(field label_sum <<< "$line")
    [ "$labels" = "$fedfleet_labels" ] ||
      { echo "byo_data: label sums differ ($labels, fedfleet $fedfleet_labels)" >&2; exit 1; }
  done
  m=$(printf '%s\n' "${runs[@]}" | median)
  echo "   median $m s" >&2
  if [ -z "$torchvision_s" ] || awk -v a="$m" -v b="$torchvision_s" 'BEGIN {exit !(a < b)}'; then
    torchvision_s=$m
  fi
done

ratio=$(awk -v a="$imagefolder_s" -v b="$torchvision_s" 'BEGIN {printf "%.3f", a / b}')
met=$(awk -v r="$ratio" 'BEGIN {print (r <= 0.5) ? 1 : 0}')
echo "goal ratio <= 0.5: $([ "$met" = 1 ] && echo met || echo NOT met)" >&2
echo "RESULT imagefolder_s=$imagefolder_s torchvision_s=$torchvision_s ratio=$ratio"
[ "$met" = 1 ]
