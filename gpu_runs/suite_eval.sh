#!/usr/bin/env bash
# The evaluation suite on one GPU each (gpu_runs/parallel.sh): the default tree, and chain +
# n-gram, on the test split at batch 1. Carry .dev/head.
#   bash gpu_runs/parallel.sh "bash gpu_runs/suite_eval.sh tree" "bash gpu_runs/suite_eval.sh chain-ngram"
set -uo pipefail
source gpu_runs/env.sh
case "$1" in
  tree) methods="eagle3" ;;
  chain-ngram) methods="chain ngram" ;;
  *) methods="$1" ;;
esac
shift
python3 -m specheads.evaluation --target $TARGET --draft ${HEAD:-.dev/head} --methods $methods --out $OUT/suite_${methods// /_} "$@" 2>&1 | grep -v -i warn
