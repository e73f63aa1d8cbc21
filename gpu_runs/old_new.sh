#!/usr/bin/env bash
# Old and new code timed side by side on one GPU: bench.py of each, alternating, REPS times.
#   bash gpu_runs/old_new.sh BASELINE_DIR [bench.py arguments]
# BASELINE_DIR holds `git archive COMMIT specheads scripts` (untracked, carried). Writes
# $OUT/old_N.json, $OUT/new_N.json and the comparison $OUT/old_new.json.
set -uo pipefail
source gpu_runs/env.sh
base=$1; shift
for i in $(seq 1 ${REPS:-3}); do
  for v in old new; do
    if [ $v = old ]; then root=$PWD/$base; else root=$PWD; fi
    PYTHONPATH=/tmp/site:$root python3 $root/scripts/bench.py --target $TARGET --out $OUT/${v}_$i --peers "$@" \
      2>&1 | grep -E "^ *(sharegpt|coding|card)" | tail -20
  done
done
olds=$(ls $OUT/old_*.json | paste -sd,); news=$(ls $OUT/new_*.json | paste -sd,)
python3 gpu_runs/compare_runs.py old=$olds new=$news --out $OUT/old_new
