#!/usr/bin/env bash
# policy_steps.py of an older checkout and of this one, in turn on one GPU (the same card, the
# same call: a refactor is timed against the code it replaces).
#   bash gpu_runs/steps_old_new.sh BASELINE_DIR LABEL [policy_steps.py arguments]
# BASELINE_DIR holds `git archive COMMIT specheads scripts gpu_runs` (git-ignored, carried); the
# head is /tmp/head (gpu_runs/stage.sh, then `mkdir -p /tmp/head && cp .dev/head/* /tmp/head/`).
# Writes $OUT/LABEL_old/policy_steps.json and $OUT/LABEL_new/policy_steps.json.
set -uo pipefail
source gpu_runs/env.sh
base=$1; label=$2; shift 2
for v in old new; do
  if [ $v = old ]; then root=$PWD/$base; else root=$PWD; fi
  echo "--- $label $v"
  PYTHONPATH=/tmp/site:$root python3 $root/gpu_runs/policy_steps.py /tmp/head --out $OUT/${label}_$v "$@" 2>&1 \
    | grep -E "b[0-9]+ +run"
done
