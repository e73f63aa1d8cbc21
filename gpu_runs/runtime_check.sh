#!/usr/bin/env bash
# First GPU look at the runtime: a quickly trained head (ShareGPT as written, 2k conversations,
# 1 epoch), then scripts/bench.py.  Not the benchmark head (that one is trained on regenerated data).
set -euo pipefail
source gpu_runs/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -m specheads.cli prepare --target $TARGET --output /tmp/prepared/quick --limit ${LIMIT:-2000} --max-length 1024 \
  2>&1 | grep -E "train / eval" || true
python3 -m specheads.cli train --config configs/smollm2-135m-eagle3.yaml --target $TARGET --data /tmp/prepared/quick \
  --output-dir /tmp/runs/quick --set train.deepspeed=null --set train.epochs=${EPOCHS:-1} --set train.eval_every=100000 \
  --set train.save_every=100000 --set data.eval_max_rows=32 2>&1 | grep -E "simulated|optimizer steps" || true
python3 scripts/bench.py --target $TARGET --draft /tmp/runs/quick/final --out $OUT/bench "$@" 2>&1 | grep -v -i warn
