#!/usr/bin/env bash
# The speculation policy's open questions (gpu_runs/README.md, "Older open questions";
# what ran: docs/history/gpu-runs-log.md), one
# part a call so that each fits the device's 10 minutes; carry .dev/head (copied to /tmp/head).
#   bash gpu_runs/policy_questions.sh wide    n-gram and adaptive at batch 32 and 64, chat then
#                                             coding, each run's stalls in the JSON (about 4 min)
#   bash gpu_runs/policy_questions.sh steps   where a mostly-plain drafting engine's time goes at
#                                             chat batch 64, and coding batch 8's choices (about 5 min)
#   bash gpu_runs/policy_questions.sh keepup  the plain steps' keep-up and the device n-gram against
#                                             the code in .dev/baseline (`git archive 59c42e0 specheads
#                                             gpu_runs | tar -x -C .dev/baseline`, carried), chat batch 64
#                                             then coding batch 1; then both lookups of this code side by
#                                             side at coding batch 1 (about 7 min; 2026-12-01's call ran
#                                             out of device time in its batch-1 half)
#   bash gpu_runs/policy_questions.sh drain chat|coding   the draining batch's ranking (the drain setting)
#                                             off and on at batch 32 and 64, beside ar and chains 1 and 6
#                                             fixed (about 4 min a set)
#   bash gpu_runs/policy_questions.sh first   the device n-gram's plain steps checking first drafts: fixed
#                                             and adaptive n-gram at coding batch 1 (16 prompts) and 8, and a
#                                             plain-only n-gram engine beside ar (what the lookup adds to a
#                                             plain step), 2 runs each (about 3 min)
#   bash gpu_runs/policy_questions.sh gap     where a chain's run at chat batch 32 and 64 spends the time its
#                                             step graphs do not (the replay of the same prompts with the
#                                             card's profile prices chain 1 at 1.44x / 1.15x `ar`; the card
#                                             measured 1.01x / 1.03x): ar, chain 1 and adaptive, each step's
#                                             host work and the prefills timed, 2 runs (about 4 min)
#   bash gpu_runs/policy_questions.sh stream chat|coding   batch 32 and 64 fed 256 prompts (a stream: rows
#                                             refill, so the slowest request no longer sets the run's time),
#                                             ar, chain 1 and chain 6 fixed, adaptive, n-gram adaptive; median
#                                             of REPEATS (3) runs (about 8 min; coding has 80 test prompts)
# Results under $OUT (policy_chat.json, policy_coding.json; steps_b64/, steps_coding_b8/;
# b64_old/, b64_new/, b1_old/, b1_new/, lookups_b1/; drain0_SET.json, drain1_SET.json; first/;
# stream_SET.json; gap/).
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
  keepup)
    [ -d .dev/baseline/specheads ] || { echo "policy_questions.sh keepup: carry .dev/baseline (see above)" >&2; exit 2; }
    bash gpu_runs/steps_old_new.sh .dev/baseline b64 --batch-sizes 64 --runs 2 --methods ar plain-eagle3 ngram-adaptive
    bash gpu_runs/steps_old_new.sh .dev/baseline b1 --set coding --prompts 16 --batch-sizes 1 --runs 2 \
      --methods ar plain-eagle3 ngram ngram-adaptive
    python3 gpu_runs/policy_steps.py $HEAD --out $OUT/lookups_b1 --set coding --prompts 16 --batch-sizes 1 --runs 2 \
      --methods ar ngram ngram-host ngram-adaptive ngram-host-adaptive 2>&1 | grep -E "b[0-9]+ +run" ;;
  drain)
    for d in 0 1; do
      BATCHES="32 64" bash gpu_runs/policy_bench.sh ${2:-chat} --out $OUT/drain${d}_${2:-chat} \
        --methods ar eagle3-tree@1,1,1:fixed eagle3-chain:fixed eagle3-tree@6,4,15:adaptive ngram:adaptive \
        --speculation-settings drain=$d
    done ;;
  first)
    python3 gpu_runs/policy_steps.py $HEAD --out $OUT/first --set coding --prompts 16 --batch-sizes 1 8 --runs 2 \
      --methods ar plain-ngram ngram ngram-adaptive 2>&1 | grep -E "b[0-9]+ +run" ;;
  gap)
    python3 gpu_runs/policy_steps.py $HEAD --out $OUT/gap --batch-sizes 32 64 --runs 2 --trace \
      --methods ar chain1 adaptive 2>&1 | grep -E "b[0-9]+ +run" ;;
  stream)
    N=256 REPEATS=${REPEATS:-3} BATCHES="32 64" bash gpu_runs/policy_bench.sh ${2:-chat} --out $OUT/stream_${2:-chat} \
      --methods ar eagle3-tree@1,1,1:fixed eagle3-chain:fixed eagle3-tree@6,4,15:adaptive ngram:adaptive ;;
  *) echo "policy_questions.sh: wide, steps, keepup, drain, first, gap or stream, not '${1:-}'" >&2; exit 2 ;;
esac
