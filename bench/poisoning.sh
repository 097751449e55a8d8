#!/usr/bin/env bash
# Persistent model poisoning against the default norm bound and quarantine (simulator).
#
# Fashion-MNIST (the first 6,000 training images, IID over the clients; the 10,000 test
# images), the MLP, one local epoch of batch 32 at lr 0.05, ROUNDS rounds (default 20), the
# same seed in every run, every aggregation key at its default. Two fleets: 4 clients, all 4
# sampled a round, one of them attacking (sim.attackers = 0.25); 20 clients, 10 sampled a round,
# 3 of them attacking (sim.attackers = 0.15). An attacker attacks every time it is sampled
# (sim.attack, docs/SIM.md):
#   const1e20   constant:1e20   1e20 in every value
#   const1e3    constant:1e3    1e3 in every value
#   signflip10  signflip:10     its honest update x -10
#   inside      inside_bound    a constant update of norm 0.99 x the coordinator's norm bound
# Each run's final test accuracy is compared with the same fleet without attackers. The quiet
# attack (inside) is never flagged by the bound; it is run again with CONTAIN, the setting that
# contains it (default: aggregation.method = "trimmed_mean", trim_fraction 0.25).
# RESULT keys (accuracy in percent, drops in points below the same fleet's clean run):
# clean_acc (the 4-client fleet's clean run) and clean_acc_3of20; one key per attack and fleet
# (const1e20_1of4 ... inside_3of20); worst_drop: the largest drop of a loud attack (const1e20,
# const1e3, signflip10) in either fleet; inside_drop: the quiet attack's largest drop with the
# defaults; contained_drop: its largest drop with CONTAIN.
# Goal (exit 0): worst_drop <= 2, and every run finished all its rounds; else exit 1. The quiet
# attack is measured, not a goal.
# Environment: BUILD_DIR (build), ROUNDS (20), WORKERS (0: all cores), CONTAIN (above), EXTRA
# (further --set arguments for every run, for example to try other defaults:
# EXTRA='--set aggregation.norm_bound_action="reject"').
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ROUNDS=${ROUNDS:-20}
WORKERS=${WORKERS:-0}
CONTAIN=${CONTAIN:-'--set aggregation.method="trimmed_mean" --set aggregation.trim_fraction=0.25'}
EXTRA=${EXTRA:-}
source bench/lib.sh  # FEDFLEET, built when missing
WORK=$(mktemp -d /tmp/poisoning.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
start_all=$(date +%s)

run() {  # name clients per_round attackers attack extra... -> "accuracy_percent rounds_ok"
  local name=$1 clients=$2 per_round=$3 attackers=$4 attack=$5 db="$WORK/$1.db"
  shift 5
  # shellcheck disable=SC2086  # EXTRA and CONTAIN are lists of arguments
  "$FEDFLEET" sim --progress off --clients "$clients" --clients-per-round "$per_round" \
    --rounds "$ROUNDS" --model mlp --workers "$WORKERS" --db "$db" \
    --set data.train_subset=6000 --set data.partition=\"iid\" --set train.epochs=1 \
    --set train.batch=32 --set train.lr=0.05 --set coordinator.deadline_s=100000 \
    --set sim.attackers="$attackers" --set sim.attack=\""$attack"\" $EXTRA "$@" \
    > "$WORK/log-$name" 2>&1 || true  # a run that stops early is judged by its rounds below
  sqlite3 -separator ' ' "$db" \
    "SELECT IFNULL((SELECT printf('%.2f', 100 * test_accuracy) FROM rounds
                    WHERE round = $ROUNDS AND status = 'ok'), '-'),
            (SELECT COUNT(*) FROM rounds WHERE round >= 1 AND status = 'ok')" 2>/dev/null ||
    echo "- 0"
}

declare -A ACC DONE
printf "%-22s %8s %9s %7s\n" run "acc %" "rounds ok" "wall s" >&2
one() {  # key clients per_round attackers attack extra...
  local key=$1 t0
  t0=$(date +%s)
  read -r ACC[$key] DONE[$key] < <(run "$@")
  printf "%-22s %8s %9s %7s\n" "$key" "${ACC[$key]}" "${DONE[$key]}" $(($(date +%s) - t0)) >&2
}

ATTACKS="const1e20:constant:1e20 const1e3:constant:1e3 signflip10:signflip:10 inside:inside_bound"
for fleet in "1of4 4 4 0.25" "3of20 20 10 0.15"; do
  read -r tag clients per_round fraction <<< "$fleet"
  one "clean_$tag" "$clients" "$per_round" 0 constant:0
  for a in $ATTACKS; do
    one "${a%%:*}_$tag" "$clients" "$per_round" "$fraction" "${a#*:}"
  done
  # shellcheck disable=SC2086
  one "inside_contained_$tag" "$clients" "$per_round" "$fraction" inside_bound $CONTAIN
  # shellcheck disable=SC2086
  one "clean_contained_$tag" "$clients" "$per_round" 0 constant:0 $CONTAIN
done

drop() {  # attacked clean -> points below clean ("-" when either is missing)
  awk -v a="$1" -v c="$2" 'BEGIN {if (a == "-" || c == "-") print "-"; else printf "%.2f\n", c - a}'
}
worst=0 inside=0 contained=0 complete=1
for key in "${!DONE[@]}"; do [ "${DONE[$key]}" = "$ROUNDS" ] || complete=0; done
max() { awk -v a="$1" -v b="$2" 'BEGIN {if (a == "-" || b == "-") print "-"; else print (a > b ? a : b)}'; }
for tag in 1of4 3of20; do
  for a in const1e20 const1e3 signflip10; do
    worst=$(max "$worst" "$(drop "${ACC[${a}_$tag]}" "${ACC[clean_$tag]}")")
  done
  inside=$(max "$inside" "$(drop "${ACC[inside_$tag]}" "${ACC[clean_$tag]}")")
  contained=$(max "$contained" \
    "$(drop "${ACC[inside_contained_$tag]}" "${ACC[clean_$tag]}")")
done
wall=$(($(date +%s) - start_all))
ok=$(awk -v w="$worst" -v c="$complete" 'BEGIN {print (w != "-" && w <= 2 && c == 1) ? 1 : 0}')
echo "poisoning: $wall s in all; goal worst_drop <= 2: $([ "$ok" = 1 ] && echo met || echo missed)" >&2
line="RESULT clean_acc=${ACC[clean_1of4]} clean_acc_3of20=${ACC[clean_3of20]}"
for tag in 1of4 3of20; do
  for a in const1e20 const1e3 signflip10 inside; do line+=" ${a}_$tag=${ACC[${a}_$tag]}"; done
done
line+=" worst_drop=$worst inside_drop=$inside contained_drop=$contained"
line+=" clean_contained_1of4=${ACC[clean_contained_1of4]}"
line+=" clean_contained_3of20=${ACC[clean_contained_3of20]} wall_s=$wall"
echo "$line"
[ "$ok" = 1 ]
