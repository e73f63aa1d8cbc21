#!/usr/bin/env bash
# The speculation policy's benchmark (issue: adaptive depth): ar, the fixed default tree, the fixed
# chain, adaptive over the same maximum, and n-gram under both policies, at batch 1, 8, 32 and
# 64, median of REPEATS (3) runs a cell, on one prompt set of the evaluation suite's test split.
#   bash gpu_runs/policy_bench.sh chat|coding     (one GPU; on several: gpu_runs/parallel.sh)
# chat = the seven single-turn chat categories taken in turn; N prompts (64). Carry .dev/head.
# SPLIT=validation takes the suite's validation part instead of its test part (40 coding prompts there).
# The adaptive engines' step costs are measured once and kept in $OUT/profile (bench.py
# --speculation-profile-dir). bench.py saves after every cell, so a run cut short keeps the cells done.
# A cell's methods run interleaved (bench.py's default: every engine built first, then their timed
# runs in turn, forward then backward): at batch 1 on an H100 a method's place in a sequential order
# moved its tokens/s by 1-3% (2026-12-06), as much as the differences the matrix compares.
set -uo pipefail
source gpu_runs/env.sh
set_name=${1:-}
# SPLIT=validation: the suite's validation part (choosing the policy's settings; test: reporting)
suite=suite; [ "${SPLIT:-test}" = validation ] && suite=suite-validation
case "$set_name" in
  chat) prompts="$suite:writing,roleplay,reasoning,math,extraction,stem,humanities" ;;
  coding) prompts="$suite:coding" ;;
  *) echo "policy_bench.sh: chat or coding, not '$set_name'" >&2; exit 2 ;;
esac
shift
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
python3 scripts/bench.py --target $TARGET --draft ${HEAD:-.dev/head} --prompts $prompts \
  --num-prompts ${N:-64} --max-new-tokens 256 --batch-sizes ${BATCHES:-1 8 32 64} --repeats ${REPEATS:-3} --peers \
  --methods ar eagle3-tree@6,4,15:fixed eagle3-chain:fixed eagle3-tree@6,4,15:adaptive ngram:fixed ngram:adaptive \
  --speculation-profile-dir $OUT/profile --out $OUT/policy_$set_name "$@" 2>&1 | grep -v -i -E "warn|Assertion"
