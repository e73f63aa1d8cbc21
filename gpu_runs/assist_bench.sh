#!/usr/bin/env bash
# The n-gram assist (method eagle3+ngram, specheads/drafters/assist.py) against the head's tree alone,
# on the evaluation suite's test split. Carry .dev/head (or set HEAD).
#   bash gpu_runs/assist_bench.sh suite          every category at batch 1 (specheads evaluate, --limit 64):
#                                                 acceptance, speedup over ar, looping share, = ar
#   bash gpu_runs/assist_bench.sh sweep          the assisted tree's width (its draft count: the lookup's chain is
#                                                 as long) chosen on the validation part (every category, VAL_LIMIT
#                                                 24 a category, batch 1) among CANDS by the mean of the chat
#                                                 macro-average's and coding's speedups, then the test part (LIMIT
#                                                 64) with TREE and the chosen one
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
  sweep)
    cands=${CANDS:-6,4,15 6,4,23 6,4,31 6,4,47}
    python3 -m specheads.evaluation --target $TARGET --draft $HEAD --split validation --limit ${VAL_LIMIT:-24} \
      --methods $(for t in $cands; do printf 'eagle3+ngram@%s ' $t; done) --out $OUT/sweep_validation "${@:2}" 2>&1 | grep -v -i warn
    chosen=$(python3 gpu_runs/kinds_table.py pick-tree --coding $OUT/sweep_validation.json --out $OUT/sweep_choice.json) || exit 1
    echo "assist: chose $chosen on the validation part"
    methods="eagle3+ngram@$TREE"; [ "$chosen" != "$TREE" ] && methods="$methods eagle3+ngram@$chosen"
    python3 -m specheads.evaluation --target $TARGET --draft $HEAD --limit ${LIMIT:-64} --methods $methods \
      --out $OUT/sweep_test "${@:2}" 2>&1 | grep -v -i warn ;;
  chat|coding)
    suite=suite; [ "${SPLIT:-test}" = validation ] && suite=suite-validation
    prompts="$suite:coding"
    [ "$1" = chat ] && prompts="$suite:writing,roleplay,reasoning,math,extraction,stem,humanities"
    python3 scripts/bench.py --target $TARGET --draft $HEAD --prompts $prompts --num-prompts ${N:-64} \
      --max-new-tokens 256 --batch-sizes ${BATCHES:-1 8} --repeats ${REPEATS:-3} --peers \
      --methods ar eagle3-tree@$TREE:fixed eagle3+ngram-tree@$TREE:fixed eagle3+ngram-tree@$TREE:adaptive \
      --speculation-profile-dir $OUT/profile --out $OUT/assist_$1 "${@:2}" 2>&1 | grep -v -i -E "warn|Assertion" ;;
  *) echo "assist_bench.sh: suite, sweep, chat or coding, not '${1:-}'" >&2; exit 2 ;;
esac
