#!/usr/bin/env bash
# "Your own data and model", end to end in a few minutes on a laptop: writes a CSV data set
# and an image folder, exports a TorchScript MLP with BatchNorm, trains it on the CSV files in a
# simulated fleet (BatchNorm statistics federated, then kept local as FedBN does), trains the
# built-in CNN on the image folder, exports the best models and evaluates the TorchScript one in
# PyTorch. Needs /usr/bin/python3 with python3-torch, python3-numpy and python3-pil.
#
#   examples/own_data/run.sh [OUT]      (OUT: default /tmp/fedfleet-own-data)
#
# OUT must be missing, empty, or a directory an earlier run of this script made (it holds the
# marker file .fedfleet-own-data): only then is it replaced. Anything else is refused, so a
# mistyped OUT never deletes a directory of yours.
# The program: FEDFLEET when set, else `fedfleet` on PATH, else the build tree's
# build/cli/fedfleet.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-/tmp/fedfleet-own-data}
marker=.fedfleet-own-data
if [ -n "${FEDFLEET:-}" ]; then
  fedfleet=$FEDFLEET
elif command -v fedfleet > /dev/null; then
  fedfleet=$(command -v fedfleet)
else
  fedfleet=$root/build/cli/fedfleet
fi
if ! command -v "$fedfleet" > /dev/null; then
  echo "run.sh: no fedfleet program: $fedfleet (install it, put it on PATH or set FEDFLEET)" >&2
  exit 2
fi
py=/usr/bin/python3

if [ -e "$out" ] || [ -L "$out" ]; then
  if [ ! -d "$out" ]; then
    echo "run.sh: OUT=$out exists and is not a directory; give another OUT" >&2
    exit 2
  elif [ -f "$out/$marker" ]; then
    rm -rf "$out"  # made by an earlier run of this script
  elif [ -n "$(ls -A "$out")" ]; then
    echo "run.sh: OUT=$out is not empty and was not made by this script (no $marker in it):" \
      "refusing to replace it; give a new or empty directory as OUT" >&2
    exit 2
  fi
fi
mkdir -p "$out"
touch "$out/$marker"
echo "fedfleet: $fedfleet; output in $out"

$py "$here/make_data.py" "$out"
$py "$here/export_bn_mlp.py" "$out/bn_mlp.pt"

csv=(--set data.format=csv --set "data.path=$out/csv/train.csv"
     --set "data.test_path=$out/csv/test.csv" --set data.label_column=label
     --set data.partition=dirichlet --set data.alpha=0.5)
common=(--clients 20 --clients-per-round 5 --rounds 8 --progress off --set train.epochs=2
        --set train.lr=0.05)

echo "== 1. CSV data, TorchScript MLP with BatchNorm (statistics federated)"
"$fedfleet" sim "${common[@]}" "${csv[@]}" --model torchscript --model-path "$out/bn_mlp.pt" \
  --db "$out/csv.db"
echo "== 2. The same, BatchNorm kept on each client (FedBN), Adam as the local optimiser"
"$fedfleet" sim "${common[@]}" "${csv[@]}" --model torchscript --model-path "$out/bn_mlp.pt" \
  --set 'model.local=["bn.*"]' --set train.optimizer=adam --set train.lr=0.005 \
  --db "$out/fedbn.db"
"$fedfleet" model info --db "$out/fedbn.db"
echo "== 3. Image folder (3 classes of 28x28 PNG files), built-in CNN"
"$fedfleet" sim "${common[@]}" --model cnn --set data.format=image-folder \
  --set "data.path=$out/images/train" --set "data.test_path=$out/images/test" \
  --set data.partition=iid --db "$out/images.db"

echo "== 4. The trained models out"
"$fedfleet" model export --db "$out/csv.db" --best -o "$out/csv_best.pt"
"$fedfleet" model export --db "$out/images.db" --best -o "$out/images_best.pt"
$py "$root/examples/models/fedfleet_models.py" "$out/csv_best.pt" --format torchscript \
  --csv "$out/csv/test.csv" --label label
"$fedfleet" history --db "$out/csv.db" | tail -n 3
echo "histories: $out/csv.db $out/fedbn.db $out/images.db; models: $out/csv_best.pt $out/images_best.pt"
