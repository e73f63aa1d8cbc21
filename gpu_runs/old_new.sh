#!/usr/bin/env bash
# Old and new code timed side by side on one GPU: bench.py of each, alternating, REPS times.
#   [NEW_ARGS="..."] bash gpu_runs/old_new.sh BASELINE_DIR [bench.py arguments]
# BASELINE_DIR holds `git archive COMMIT specheads scripts` (untracked, carried); NEW_ARGS go
# to the new bench.py only (options the old one lacks, e.g. "--speculation-policy fixed
# --repeats 1" to time the same fixed tree, one run a cell, as an older bench.py does). NO_STOP=1:
# no stop tokens in either (gpu_runs/no_stop.py), the same number of tokens a prompt. Writes
# $OUT/old_N.json, $OUT/new_N.json and the comparison $OUT/old_new.json.
set -uo pipefail
source gpu_runs/env.sh
base=$1; shift
for i in $(seq 1 ${REPS:-3}); do
  for v in old new; do
    if [ $v = old ]; then root=$PWD/$base; extra=""; else root=$PWD; extra=${NEW_ARGS:-}; fi
    run=""; [ "${NO_STOP:-0}" = 1 ] && run=gpu_runs/no_stop.py  # every answer to its budget
    PYTHONPATH=/tmp/site:$root python3 $run $root/scripts/bench.py --target $TARGET --out $OUT/${v}_$i --peers $extra "$@" \
      2>&1 | grep -E "^ *(sharegpt|coding|card)" | tail -20
  done
done
olds=$(ls $OUT/old_*.json | paste -sd,); news=$(ls $OUT/new_*.json | paste -sd,)
python3 gpu_runs/compare_runs.py old=$olds new=$news --out $OUT/old_new
rm -f $OUT/old_*.png $OUT/new_*.png  # at most 8 files come back
