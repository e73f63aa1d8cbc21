#!/usr/bin/env bash
# The speculation policy's open questions (gpu_runs/README.md, "The policy's open questions"), one
# part a call so that each fits the device's 10 minutes; carry .dev/head (copied to /tmp/head).
#   bash gpu_runs/policy_questions.sh wide    n-gram and adaptive at batch 32 and 64, chat then
#                                             coding, each run's stalls in the JSON (about 4 min)
#   bash gpu_runs/policy_questions.sh steps   where a mostly-plain drafting engine's time goes at
#                                             chat batch 64, and coding batch 8's choices (about 5 min)
# Results under $OUT (policy_chat.json, policy_coding.json; steps_b64/, steps_coding_b8/).
set -uo pipefail
source gpu_runs/env.sh
export HEAD=${HEAD:-/tmp/head}
[ -f "$HEAD/config.json" ] || { mkdir -p /tmp/head && cp .dev/head/* /tmp/head/ && export HEAD=/tmp/head; }
case "${1:-}" in
  wide)
    for set_name in chat coding; do
      BATCHES="32 64" bash gpu_runs/policy_bench.sh $set_name \
        --methods ar ngram:fixed ngram:adaptive eagle3-chain:fixed eagle3-tree@6,4,15:adaptive
    done ;;
  steps)
    python3 gpu_runs/policy_steps.py $HEAD --out $OUT/steps_b64 --batch-sizes 64 --runs 2 --trace \
      --methods ar plain-eagle3 adaptive plain-ngram ngram-adaptive 2>&1 | grep -v -i -E "warn|Assertion|Converting|Loading|Writing"
    python3 gpu_runs/policy_steps.py $HEAD --out $OUT/steps_coding_b8 --set coding --batch-sizes 8 --runs 2 \
      --trace --methods tree adaptive 2>&1 | grep -v -i -E "warn|Assertion|Converting|Loading|Writing" ;;
  *) echo "policy_questions.sh: wide or steps, not '${1:-}'" >&2; exit 2 ;;
esac
