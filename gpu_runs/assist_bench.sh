#!/usr/bin/env bash
# The n-gram assist (method eagle3+ngram, specheads/drafters/assist.py) against the head's tree alone,
# on the evaluation suite's test split. Carry .dev/head (or set HEAD).
#   bash gpu_runs/assist_bench.sh suite          every category at batch 1 (specheads evaluate, --limit 64):
#                                                 acceptance, speedup over ar, looping share, = ar
#   bash gpu_runs/assist_bench.sh chat|coding    batch 1 and 8 (BATCHES), median of REPEATS (3) runs a cell:
#                                                 ar, the tree, the assisted tree (fixed and adaptive)
set -uo pipefail
source gpu_runs/env.sh
HEAD=${HEAD:-.dev/head}
TREE=${TREE:-6,4,15}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
case "${1:-}" in
  suite)
    python3 -m specheads.evaluation --target $TARGET --draft $HEAD --methods eagle3@$TREE eagle3+ngram@$TREE \
      --limit ${LIMIT:-64} --out $OUT/suite_assist "${@:2}" 2>&1 | grep -v -i warn ;;
  chat|coding)
    suite=suite; [ "${SPLIT:-test}" = validation ] && suite=suite-validation
    prompts="$suite:coding"
    [ "$1" = chat ] && prompts="$suite:writing,roleplay,reasoning,math,extraction,stem,humanities"
    python3 scripts/bench.py --target $TARGET --draft $HEAD --prompts $prompts --num-prompts ${N:-64} \
      --max-new-tokens 256 --batch-sizes ${BATCHES:-1 8} --repeats ${REPEATS:-3} --peers \
      --methods ar eagle3-tree@$TREE:fixed eagle3+ngram-tree@$TREE:fixed eagle3+ngram-tree@$TREE:adaptive \
      --speculation-profile-dir $OUT/profile --out $OUT/assist_$1 "${@:2}" 2>&1 | grep -v -i -E "warn|Assertion" ;;
  *) echo "assist_bench.sh: suite, chat or coding, not '${1:-}'" >&2; exit 2 ;;
esac
