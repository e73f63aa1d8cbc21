#!/usr/bin/env bash
# The evaluation suite on one GPU each (scripts/gpu/parallel.sh): the default tree, and chain +
# n-gram, on the test split at batch 1. Carry .dev/head.
#   bash scripts/gpu/parallel.sh "bash scripts/gpu/suite_eval.sh tree" "bash scripts/gpu/suite_eval.sh chain-ngram"
set -uo pipefail
source scripts/gpu/env.sh
case "$1" in
  tree) methods="eagle3" ;;
  chain-ngram) methods="chain ngram" ;;
  *) methods="$1" ;;
esac
shift
python3 -m specheads.evaluation --target $TARGET --draft ${HEAD:-.dev/head} --methods $methods --out $OUT/suite_${methods// /_} "$@" 2>&1 | grep -v -i warn
