#!/usr/bin/env bash
# The adaptive policy's full_share and hold settings (specheads/runtime/policy.py) on the card. Carry
# .dev/head (or set HEAD).
#   bash gpu_runs/share_hold.sh steps          coding batch 1, 64 prompts, 2 runs: each step's host work
#                                               by part (policy_steps.py), the fixed assisted tree against
#                                               adaptive with the gate, without and with hold
#   bash gpu_runs/share_hold.sh chat|coding    batch 8 and 32 (BATCHES), median of REPEATS (3): ar, the fixed
#                                               assisted tree and adaptive, then adaptive with SETTINGS
#                                               (full_share=0.01,hold=0.1) in the same call; ADAPTIVE
#                                               names the adaptive method (e.g. BATCHES=1
#                                               ADAPTIVE=eagle3+ngram-tree@6,4,15:adaptive:ngram_gate=1)
set -uo pipefail
source gpu_runs/env.sh
HEAD=${HEAD:-.dev/head}
SETTINGS=${SETTINGS:-full_share=0.01,hold=0.1}
M="eagle3+ngram-tree@6,4,15"
A=${ADAPTIVE:-$M:adaptive}
BATCHES=${BATCHES:-8 32}
case "${1:-}" in
  steps)
    python3 gpu_runs/policy_steps.py $HEAD --out $OUT/steps_b1 --batch-sizes 1 --runs 2 --set coding --cprofile \
      --methods assist assist-adaptive-gated assist-adaptive-gated-hold 2>&1 | grep -v -i warn | cut -c1-400 ;;
  chat|coding)
    n=64; [ "$1" = chat ] && n=128
    for s in "" "$SETTINGS"; do
      if [ -z "$s" ]; then methods="ar $M:fixed $A"; extra=(); tag=default
      else methods="$A"; extra=(--speculation-settings "$s"); tag=settings; fi
      N=${N:-$n} BATCHES="$BATCHES" REPEATS=${REPEATS:-3} HEAD=$HEAD bash gpu_runs/assist_bench.sh $1 \
        --methods $methods "${extra[@]}" --out $OUT/$1_b${BATCHES// /_}_$tag
    done ;;
  *) echo "share_hold.sh: steps, chat or coding, not '${1:-}'" >&2; exit 2 ;;
esac
