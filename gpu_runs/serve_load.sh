#!/usr/bin/env bash
# Load test of `specheads serve` on the GPU: SmolLM2-135M-Instruct ($TARGET) + a trained head,
# 1/8/32 streaming clients on loopback, speculation on / off per request / an ar server.
#   bash gpu_runs/serve_load.sh HEAD_DIR [serve_load.py args]     (or HEAD=... bash ...)
# Files: $OUT/serve_load.json, $OUT/serve_load.png, $OUT/gpu.txt
set -euo pipefail
source gpu_runs/env.sh
HEAD=${1:-${HEAD:?usage: serve_load.sh HEAD_DIR [args]}}
shift || true
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
PROMPTS=()
[ -f .dev/prompts/sharegpt.json ] && PROMPTS=(--prompt-file .dev/prompts/sharegpt.json)
python3 scripts/serve_load.py --target $TARGET --draft $HEAD "${PROMPTS[@]}" --out $OUT/serve_load "$@" 2>&1 | grep -v -i warn
