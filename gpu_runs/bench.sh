#!/usr/bin/env bash
# The decoding benchmark (scripts/bench.py) on the GPU: our methods at batch 1 and 8 on held-out ShareGPT and
# coding prompts, the 8B-shape verify cost, then transformers peers at batch 1.
# Carry .dev/head (a trained head: gpu_runs/fetch_head.sh) and .dev/prompts/sharegpt.json.
set -euo pipefail
source gpu_runs/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 scripts/bench.py --target $TARGET --draft ${HEAD:-.dev/head} --prompts .dev/prompts/sharegpt.json coding \
  --num-prompts ${N:-6} --batch-sizes 1 8 --out $OUT/bench "$@" 2>&1 | grep -v -i "warn\|Assertion"
