#!/usr/bin/env bash
# policy_steps.py of an older checkout and of this one, in turn on one GPU (the same card, the
# same call: a refactor is timed against the code it replaces).
#   [ROUNDS=N] bash gpu_runs/steps_old_new.sh BASELINE_DIR LABEL [policy_steps.py arguments]
# BASELINE_DIR holds `git archive COMMIT specheads scripts gpu_runs` (git-ignored, carried); the
# head is /tmp/head (gpu_runs/stage.sh, then `mkdir -p /tmp/head && cp .dev/head/* /tmp/head/`).
# Writes $OUT/LABEL_old/policy_steps.json and $OUT/LABEL_new/policy_steps.json. ROUNDS=N (default
# 1) runs the pair N times, old first in odd rounds and new first in even ones (a drift of the card
# over the call then falls on both sides alike), into $OUT/LABEL_old_rI and $OUT/LABEL_new_rI.
set -uo pipefail
source gpu_runs/env.sh
base=$1; label=$2; shift 2
rounds=${ROUNDS:-1}
for ((i = 1; i <= rounds; i++)); do
  if ((i % 2)); then order="old new"; else order="new old"; fi
  for v in $order; do
    if [ $v = old ]; then root=$PWD/$base; else root=$PWD; fi
    out=$OUT/${label}_$v
    if ((rounds > 1)); then out=${out}_r$i; fi
    echo "--- $label $v${ROUNDS:+ round $i}"
    PYTHONPATH=/tmp/site:$root python3 $root/gpu_runs/policy_steps.py /tmp/head --out $out "$@" 2>&1 \
      | grep -E "b[0-9]+ +run"
  done
done
