#!/usr/bin/env bash
# Training across the cards of one machine (the multi-GPU issue): 1 -> 2 -> 4 -> 8 cards.
#   weak scaling   fixed per-GPU micro-batch (train.batch_size=$BATCH), $STEPS steps each: tokens/s per
#                  GPU and efficiency against 1 card (steps after the first $SKIP_PCT% only)
#   equivalence    fixed global batch (train.global_batch_size=$GLOBAL): per-step loss of n cards
#                  against 1 card over the first $EQ_STEPS steps (the accumulation makes up the rest)
#   CARDS="1 2 4 8" STEPS=60 EQ_STEPS=100 BATCH=16 GLOBAL=128 bash gpu_runs/scaling.sh
# (EXTRA="--set ..." goes to every run; CONFIG= empty takes the defaults: a CPU dry run on the tests'
# tiny target and data passed on 2026-11-28 with CARDS="1 2" STEPS=4 EQ_STEPS=4 BATCH=2 GLOBAL=4
# REGEN_CARDS=1)
#   REGEN_CARDS="1 8" REGEN_LIMIT=2048: also `specheads prepare --regenerate --devices N` timed on N cards,
#                  its answers compared with one card's
# Data: the prepared folder $DATA (default /tmp/prepared/smollm2), else prepared here from the carried
# regeneration (.dev/regen, --cut-loops 32: the current head's data). Writes $OUT/scaling.json (the table
# of gpu_runs/scaling_table.py) and each run's metrics; a plot comes from the table script here
# (`python3 gpu_runs/scaling_table.py ROOT --out DIR`, with matplotlib). Every run resumes where a
# previous call stopped (the equivalence runs save every 20 steps; a weak-scaling run, timed, saves
# none and starts again), so a 10-minute call limit only splits the work.
set -uo pipefail
source gpu_runs/env.sh
CARDS=${CARDS:-"1 2 4 8"}
STEPS=${STEPS:-60}
EQ_STEPS=${EQ_STEPS:-100}
BATCH=${BATCH:-16}
GLOBAL=${GLOBAL:-128}
CONFIG=${CONFIG:-configs/smollm2-135m-eagle3.yaml}
DATA=${DATA:-/tmp/prepared/smollm2}
ROOT=${ROOT:-/tmp/scaling}
REGEN=${REGEN:-.dev/regen}
PY=${PY:-python3}
mkdir -p $ROOT $OUT
if [ ! -f $DATA/prepare_report.json ]; then
  ls $REGEN/part* >/dev/null 2>&1 || { echo "scaling: no $DATA and no $REGEN/part* (carry .dev/regen)"; exit 1; }
  cat $REGEN/part* > $ROOT/regenerated.jsonl.gz
  $PY -m specheads.cli prepare --target $TARGET --output $DATA --data $ROOT/regenerated.jsonl.gz --cut-loops 32 \
    2>&1 | grep -v -E "it/s\]|conv/s\]" | tail -5
fi
COMMON="${CONFIG:+--config $CONFIG} --target $TARGET --data $DATA --set train.save_every=20 \
  --set train.eval_every=1000000 --set train.log_every=1 --set train.keep_checkpoints=1 ${EXTRA:-}"
run() {  # run NAME CARDS ARGS...: one training run, resumed if a checkpoint is there
  local name=$1 n=$2; shift 2
  [ -f $ROOT/$name/train_summary.json ] && return 0
  echo "scaling: $name on $n card(s)"
  deepspeed --num_gpus $n --master_port $((29500 + n)) train/train.py $COMMON --output-dir $ROOT/$name "$@" \
    2>&1 | grep -E "optimizer steps|error|Error|final head" | tail -3
}
for n in $CARDS; do
  run weak$n $n --set train.max_steps=$STEPS --set train.batch_size=$BATCH --set train.save_every=1000000
  run eq$n $n --set train.max_steps=$EQ_STEPS --set train.global_batch_size=$GLOBAL \
    --set train.batch_size=$(( GLOBAL / ${CARDS##* } < BATCH ? GLOBAL / ${CARDS##* } : BATCH ))
done
# regeneration (prepare --regenerate --devices N) on REGEN_CARDS, the first REGEN_LIMIT conversations'
# first user turns of the carried regeneration: seconds and whether the answers equal one card's
for n in ${REGEN_CARDS:-}; do
  [ -f $ROOT/regen$n/timing.json ] && continue
  [ -f $ROOT/regenerated.jsonl.gz ] || cat $REGEN/part* > $ROOT/regenerated.jsonl.gz
  echo "scaling: regenerate on $n card(s)"
  t0=$SECONDS
  $PY -m specheads.cli prepare --target $TARGET --data $ROOT/regenerated.jsonl.gz --regenerate --devices $n \
    --limit ${REGEN_LIMIT:-2048} --max-turns 1 --output $ROOT/regen$n 2>&1 | grep -v -E "it/s\]|conv/s\]|turn/s\]" | tail -3
  [ -f $ROOT/regen$n/prepare_report.json ] && echo "{\"cards\": $n, \"seconds\": $((SECONDS - t0))}" > $ROOT/regen$n/timing.json
done
$PY gpu_runs/scaling_table.py $ROOT --out $OUT/scaling
for d in $ROOT/weak* $ROOT/eq*; do
  [ -d $d ] && mkdir -p $OUT/runs/$(basename $d) && cp $d/metrics.jsonl $d/train_summary.json $OUT/runs/$(basename $d)/ 2>/dev/null
done
true
