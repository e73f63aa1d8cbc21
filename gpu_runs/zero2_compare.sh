#!/usr/bin/env bash
# ZeRO-2 on 2 GPUs vs 1 GPU, same optimizer batches: 1 GPU runs batch 8 x accum 2, 2 GPUs run
# batch 8 each; epoch_batches hands rank r the batches r, r+2, ... so every optimizer step sees
# the same 16 sequences.  Writes both metrics and a comparison plot to $OUT/zero2.
set -euo pipefail
source gpu_runs/env.sh
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
python3 -m specheads.cli prepare --target $TARGET --output /tmp/prepared/smollm2 --limit ${LIMIT:-3000} --max-length 1024 \
  2>&1 | grep -E "train / eval|train tokens" || true
STEPS=${STEPS:-150}
common="--max-steps $STEPS --set train.log_every=5 --set train.eval_every=100000 --set train.save_every=100000 --set train.batch_size=8 --set data.eval_max_rows=64"
NGPU=1 PORT=29501 RUN=/tmp/runs/z1 bash gpu_runs/smollm2_train.sh $common --set train.grad_accum=2 | grep -E "simulated|optimizer steps" || true
NGPU=2 PORT=29502 RUN=/tmp/runs/z2 bash gpu_runs/smollm2_train.sh $common --set train.grad_accum=1 | grep -E "simulated|optimizer steps" || true
python3 gpu_runs/compare_curves.py /tmp/runs/z1/metrics.jsonl /tmp/runs/z2/metrics.jsonl --labels "1 GPU (batch 8 x accum 2)" "2 GPUs ZeRO-2 (batch 8 each)" --out $OUT/zero2_loss
