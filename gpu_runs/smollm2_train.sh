#!/usr/bin/env bash
# Train the EAGLE-3 head on the prepared data.  NGPU=1|2; extra args go to `specheads train`.
set -euo pipefail
source gpu_runs/env.sh
NGPU=${NGPU:-1}
RUN=${RUN:-/tmp/runs/smollm2-eagle3-${NGPU}gpu}
deepspeed --num_gpus $NGPU --master_port ${PORT:-29500} train/train.py --config configs/smollm2-135m-eagle3.yaml \
  --target $TARGET --data /tmp/prepared/smollm2 --output-dir $RUN "$@" 2>&1 | grep -v -E "step/s|it/s\]" || true
mkdir -p $OUT/${NGPU}gpu
cp $RUN/metrics.jsonl $RUN/train_summary.json $RUN/train_curves.png $OUT/${NGPU}gpu/ 2>/dev/null || true
cp $RUN/final/config.json $OUT/${NGPU}gpu/ 2>/dev/null || true
