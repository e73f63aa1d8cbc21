#!/usr/bin/env bash
# Regenerate ShareGPT with SmolLM2-135M-Instruct on the GPU, then tokenize.  Args are passed to prepare.
set -euo pipefail
source gpu_runs/env.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/gpu.txt
python3 -m specheads.cli prepare --target $TARGET --output /tmp/prepared/smollm2 --regenerate "$@" 2>&1 | grep -v -E "it/s\]|conv/s\]|turn/s\]" || true
cp /tmp/prepared/smollm2/prepare_report.json $OUT/
