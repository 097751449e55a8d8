#!/usr/bin/env bash
# The simulator against the plain loop a user would write by hand.
#
# Both run the same experiment: Fashion-MNIST, 100 clients Dirichlet(0.5), 10 sampled a round,
# E=1, B=32, lr 0.05, plain SGD, server-side evaluation on the 10k test set every round,
# 20 rounds, once with the MLP 784-200-200-10 and once with the FedAvg CNN.
# Baseline: bench/baselines/fedavg_pytorch.py (Debian's python3-torch, the same LibTorch 1.13)
# with 1 and with 2 threads; the faster counts. For the CNN (about 12 s a round on 2 cores) the
# thread counts are compared on CNN_PROBE_ROUNDS rounds each and the faster one then runs all
# rounds for the accuracy; its median round joins the comparison.
# fedfleet: `fedfleet sim` on the uniform fleet with one worker per core. A round's wall time is
# the time between the ends of consecutive rounds (rounds run back to back; evaluation of a
# round overlaps the next one's training), so it includes evaluation, as the Python round does.
#
# Figures: median round ratio (fedfleet / best Python) per model, the final accuracy gap
# (fedfleet - Python, points), fedfleet's peak RSS over the larger of the two models' runs, and
# flops_fraction: the CNN's training FLOP/s on all cores (3 x forward multiply-adds x 2 per
# sample, over the wall time of the training jobs, times the workers) against the FLOP/s of a
# large convolution through LibTorch on all cores, measured in the same run.
# cnn_gemm_fraction: the same CNN training FLOP/s over a 2048^3 sgemm's FLOP/s through LibTorch
# on as many threads, measured in the same run.
# cnn_bf16_ratio: a probe of BF16_ROUNDS CNN rounds with sim.precision = "bf16" (mixed
# precision), the median of its rounds' wall_end - wall_start over the same median of the fp32
# CNN run's rounds.
# Goals, against the machine's limit rather than against the loop: cnn_gemm_fraction >= 0.9 (the
# CNN trains at 90% or more of what a large sgemm reaches on the same cores), mlp_ratio <= 1 and
# cnn_ratio <= 1 (never slower than the plain loop), |acc gaps| <= 1.5, sim RSS below the Python
# loop's (flops_fraction is reported, not a gate), and cnn_bf16_ratio <= 0.55 only on a CPU that
# reports native bf16 (avx512_bf16 or amx_bf16 in /proc/cpuinfo: bf16 products run at twice
# fp32's rate there, so 0.5 is the limit; elsewhere LibTorch emulates bf16, far slower than fp32,
# and the ratio is reported, not a gate). The plain loop already runs near the compute limit, so
# a fixed fraction of its round time is no goal anyone can meet once the simulator is at it.
# Environment: BUILD_DIR (default build), ROUNDS (20), CNN_PROBE_ROUNDS (3), BATCH (0; 1: the
# simulator trains each round's clients batched, sim.batch_clients = true), BF16_ROUNDS (1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-20}
CNN_PROBE_ROUNDS=${CNN_PROBE_ROUNDS:-3}
BF16_ROUNDS=${BF16_ROUNDS:-1}
BATCH=${BATCH:-0}
SIM_EXTRA=()
if [ "$BATCH" = 1 ]; then SIM_EXTRA=(--set sim.batch_clients=true); fi
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/sim_vs_pytorch.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
field() { sed -n "s/^RESULT .*$1=\([0-9.e+-]*\).*/\1/p" "$2"; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR==0) {print "nan"; exit} if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

python_run() {  # model threads rounds -> log file; peak RSS KiB in log.rss
  local log="$WORK/py-$1-$2-$3.log"
  /usr/bin/time -f "%M" -o "$log.rss" /usr/bin/python3 bench/baselines/fedavg_pytorch.py \
    --model "$1" --threads "$2" --rounds "$3" > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
  echo "$log"
}

sim_run() {  # model [name rounds more-args...] -> db; peak RSS KiB in db.rss
  local model=$1 name=${2:-$1} rounds=${3:-$ROUNDS}
  shift $(($# < 3 ? $# : 3))
  local db="$WORK/sim-$name.db"
  /usr/bin/time -f "%M" -o "$db.rss" "$FEDFLEET" sim --progress off --model "$model" \
    --clients 100 --clients-per-round 10 --rounds "$rounds" --fleet uniform --workers 0 \
    --db "$db" --set data.partition=\"dirichlet\" --set data.alpha=0.5 --set train.epochs=1 \
    --set train.batch=32 --set train.lr=0.05 --set coordinator.deadline_s=100000 \
    "${SIM_EXTRA[@]}" "$@" > "$WORK/sim-$name.log" 2>&1 ||
    { cat "$WORK/sim-$name.log" >&2; exit 1; }
  echo "$db"
}

sim_median_round() {  # db -> median seconds between the ends of consecutive rounds
  sqlite3 "$1" "SELECT wall_end FROM rounds WHERE round >= 0 ORDER BY round" |
    awk 'NR > 1 {print $1 - prev} {prev = $1}' | median
}

sim_median_span() {  # db -> median of the rounds' wall_end - wall_start (one round will do)
  sqlite3 "$1" "SELECT wall_end - wall_start FROM rounds WHERE round >= 1 ORDER BY round" | median
}

# --- the Python loop --------------------------------------------------------------------------
echo "== Python loop, MLP" >&2
py_mlp_1=$(python_run mlp 1 "$ROUNDS")
py_mlp_2=$(python_run mlp 2 "$ROUNDS")
read -r py_mlp_s py_mlp_log < <(for l in "$py_mlp_1" "$py_mlp_2"; do
  echo "$(field median_round_s "$l") $l"; done | sort -g | head -1)
py_mlp_acc=$(field final_acc "$py_mlp_log")
echo "   best median round $py_mlp_s s ($py_mlp_log), final accuracy $py_mlp_acc %" >&2

echo "== Python loop, CNN" >&2
probe_1=$(python_run cnn 1 "$CNN_PROBE_ROUNDS")
probe_2=$(python_run cnn 2 "$CNN_PROBE_ROUNDS")
t1=$(field median_round_s "$probe_1")
t2=$(field median_round_s "$probe_2")
cnn_threads=$(awk -v a="$t1" -v b="$t2" 'BEGIN {print (a <= b) ? 1 : 2}')
echo "   probe: 1 thread $t1 s, 2 threads $t2 s a round; full run with $cnn_threads" >&2
py_cnn_log=$(python_run cnn "$cnn_threads" "$ROUNDS")
py_cnn_s=$(printf "%s\n%s\n%s\n" "$t1" "$t2" "$(field median_round_s "$py_cnn_log")" | sort -g | head -1)
py_cnn_acc=$(field final_acc "$py_cnn_log")
echo "   best median round $py_cnn_s s, final accuracy $py_cnn_acc %" >&2
py_rss_kib=$(cat "$WORK"/py-*.rss | sort -g | tail -1)

# --- fedfleet sim -----------------------------------------------------------------------------
echo "== fedfleet sim, MLP" >&2
sim_mlp=$(sim_run mlp)
sim_mlp_s=$(sim_median_round "$sim_mlp")
sim_mlp_acc=$(sqlite3 "$sim_mlp" "SELECT 100 * test_accuracy FROM rounds WHERE round = $ROUNDS")
echo "   median round $sim_mlp_s s, final accuracy $sim_mlp_acc %" >&2
echo "== fedfleet sim, CNN" >&2
sim_cnn=$(sim_run cnn)
sim_cnn_s=$(sim_median_round "$sim_cnn")
sim_cnn_acc=$(sqlite3 "$sim_cnn" "SELECT 100 * test_accuracy FROM rounds WHERE round = $ROUNDS")
echo "   median round $sim_cnn_s s, final accuracy $sim_cnn_acc %" >&2
sim_rss_kib=$(cat "$sim_mlp.rss" "$sim_cnn.rss" | sort -g | tail -1)
workers=$(nproc)

echo "== fedfleet sim, CNN, sim.precision = bf16, $BF16_ROUNDS round(s)" >&2
sim_bf16=$(sim_run cnn cnn-bf16 "$BF16_ROUNDS" --set sim.precision=\"bf16\")
bf16_span=$(sim_median_span "$sim_bf16")
fp32_span=$(sim_median_span "$sim_cnn")
bf16_ratio=$(awk -v b="$bf16_span" -v f="$fp32_span" 'BEGIN {printf "%.3f", b / f}')
echo "   median round (wall_end - wall_start) $bf16_span s against fp32's $fp32_span s" >&2
if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  bf16_checked=1
else
  bf16_checked=0
  echo "   cnn_bf16_ratio <= 0.55 is not checked on this CPU: /proc/cpuinfo reports neither" \
    "avx512_bf16 nor amx_bf16, so LibTorch emulates bf16 (slower than fp32)" >&2
fi

# CNN training FLOP/s: 6 x 12,273,152 multiply-adds... per sample over the training jobs' wall
# time; a large convolution's FLOP/s on all cores through the same LibTorch as the reference.
cnn_flops=$(sqlite3 "$sim_cnn" "SELECT SUM(n_samples), SUM(wall_compute_s) FROM updates
  WHERE status = 'completed'" | awk -F'|' -v w="$workers" \
  'BEGIN {macs = 28*28*32*25 + 14*14*64*32*25 + 3136*512 + 512*10}
   {printf "%.4g", 6 * macs * $1 / $2 * w}')
conv_flops=$(/usr/bin/python3 - "$workers" <<'PY'
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
x, w = torch.randn(64, 64, 56, 56), torch.randn(64, 64, 3, 3)
for _ in range(2):
    torch.nn.functional.conv2d(x, w, padding=1)
times = []
for _ in range(7):
    t = time.perf_counter()
    torch.nn.functional.conv2d(x, w, padding=1)
    times.append(time.perf_counter() - t)
times.sort()
print("%.4g" % (2 * 64 * 64 * 56 * 56 * 64 * 9 / times[len(times) // 2]))
PY
)

# This machine's FP32 matrix-multiply rate: a 2048^3 sgemm through the same LibTorch on as
# many threads as the simulator's workers together (the median of 7).
gemm_flops=$(/usr/bin/python3 - "$workers" <<'PY'
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
n = 2048
a, b = torch.randn(n, n), torch.randn(n, n)
for _ in range(2):
    torch.mm(a, b)
times = []
for _ in range(7):
    t = time.perf_counter()
    torch.mm(a, b)
    times.append(time.perf_counter() - t)
times.sort()
print("%.4g" % (2 * n ** 3 / times[len(times) // 2]))
PY
)

read -r mlp_ratio cnn_ratio mlp_gap cnn_gap flops_fraction gemm_fraction < <(awk \
  -v sm="$sim_mlp_s" -v pm="$py_mlp_s" -v sc="$sim_cnn_s" -v pc="$py_cnn_s" \
  -v am="$sim_mlp_acc" -v bm="$py_mlp_acc" -v ac="$sim_cnn_acc" -v bc="$py_cnn_acc" \
  -v f="$cnn_flops" -v c="$conv_flops" -v g="$gemm_flops" \
  'BEGIN {printf "%.3f %.3f %.2f %.2f %.3f %.3f\n", sm / pm, sc / pc, am - bm, ac - bc, f / c, f / g}')
sim_rss=$(awk -v k="$sim_rss_kib" 'BEGIN {printf "%.0f", k / 1024}')
py_rss=$(awk -v k="$py_rss_kib" 'BEGIN {printf "%.0f", k / 1024}')
echo "CNN training $cnn_flops FLOP/s against a large convolution's $conv_flops FLOP/s" \
  "and a large sgemm's $gemm_flops FLOP/s" >&2
echo "peak RSS: fedfleet sim $sim_rss MiB, Python loop $py_rss MiB" >&2
ok=$(awk -v a="$mlp_ratio" -v b="$cnn_ratio" -v c="$mlp_gap" -v d="$cnn_gap" -v s="$sim_rss" \
  -v p="$py_rss" -v g="$gemm_fraction" -v r="$bf16_ratio" -v k="$bf16_checked" \
  'function abs(x) {return x < 0 ? -x : x}
  BEGIN {print (a <= 1 && b <= 1 && g >= 0.9 && abs(c) <= 1.5 && abs(d) <= 1.5 && s < p &&
                (k == 0 || r <= 0.55)) ? 1 : 0}')
echo "RESULT mlp_ratio=$mlp_ratio cnn_ratio=$cnn_ratio mlp_acc_gap=$mlp_gap" \
  "cnn_acc_gap=$cnn_gap sim_rss_mib=$sim_rss flops_fraction=$flops_fraction" \
  "cnn_gemm_fraction=$gemm_fraction cnn_bf16_ratio=$bf16_ratio" \
  "py_rss_mib=$py_rss mlp_sim_s=$sim_mlp_s mlp_py_s=$py_mlp_s cnn_sim_s=$sim_cnn_s" \
  "cnn_py_s=$py_cnn_s"
[ "$ok" = 1 ]
