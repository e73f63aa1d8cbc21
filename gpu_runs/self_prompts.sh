#!/usr/bin/env bash
# Prompts the target writes itself (`specheads self-prompts`), answered by the target with the
# settings of the saved ShareGPT regeneration (greedy, at most 512 new tokens a turn, answers cut
# at their first repeated 32-gram), across device calls: each call does what is left and stops
# before BUDGET seconds; the sampled chunks and the regeneration's state stay in /tmp while the
# machine is warm. After staging (gpu_runs/README.md, "Staging"; the chat wheels of .dev/c are not
# needed), back to back until it prints "self-prompts: answered":
#   bash gpu_runs/self_prompts.sh
# The answered conversations come back as $OUT/regen-self-prompts/part* (at most 16 MB each):
# keep them as .dev/regen-self-prompts/ and carry that folder with .dev/regen for a head's data.
# Env: COUNT (prompts sampled, default 30000), SEED (0), BUDGET (s, 550), TARGET (env.sh's SmolLM2),
#      ROOT (/tmp/self-prompts), NGPU (regeneration devices: default all; 0 = CPU), PY (python3),
#      SAMPLE_ARGS and REGEN_ARGS (more flags for self-prompts and for prepare; a later one wins).
# CPU dry run: tests/test_self_prompts_script.py.
set -uo pipefail
source gpu_runs/env.sh
T0=$SECONDS
BUDGET=${BUDGET:-550}
COUNT=${COUNT:-30000}
SEED=${SEED:-0}
ROOT=${ROOT:-/tmp/self-prompts}
PY=${PY:-python3}
if [ -z "${NGPU:-}" ]; then NGPU=$(nvidia-smi -L 2>/dev/null | wc -l); fi
left() { echo $(( BUDGET - (SECONDS - T0) )); }
[ "$NGPU" -gt 0 ] && nvidia-smi --query-gpu=name --format=csv,noheader
DEVICES=$([ "$NGPU" -gt 0 ] && echo $NGPU || echo cpu)
mkdir -p $ROOT $OUT
if [ ! -f $ROOT/prompts/prompts.jsonl.gz ]; then
  echo "self-prompts: sampling $COUNT ($(left) s left)"
  timeout -s TERM -k 20 $(left) $PY -m specheads.cli self-prompts --target $TARGET --out $ROOT/prompts \
    --count $COUNT --seed $SEED --batch-size 512 --chunk 2048 ${SAMPLE_ARGS:-} > $OUT/self_prompts.log 2>&1
  grep -v -E "prompt/s\]|s/prompt\]" $OUT/self_prompts.log | tail -20
  [ -f $ROOT/prompts/prompts.jsonl.gz ] || { echo "self-prompts: sampling to be continued"; exit 0; }
  cp $ROOT/prompts/info.json $OUT/self_prompts_info.json
fi
if [ ! -f $ROOT/prepared/prepare_report.json ]; then
  echo "self-prompts: answering on $DEVICES ($(left) s left)"
  timeout -s TERM -k 20 $(left) $PY -m specheads.cli prepare --target $TARGET --output $ROOT/prepared \
    --data $ROOT/prompts/prompts.jsonl.gz --regenerate --devices $DEVICES --batch-size 512 --max-new-tokens 512 \
    --cut-loops 32 ${REGEN_ARGS:-} > $OUT/prepare.log 2>&1
  grep -v -E "it/s\]|conv/s\]|turn/s\]|s/turn\]|^frame #" $OUT/prepare.log | tail -30
  [ -f $ROOT/prepared/prepare_report.json ] || { echo "self-prompts: answering to be continued"; exit 0; }
fi
cp $ROOT/prepared/prepare_report.json $OUT/self_prompts_prepare_report.json
mkdir -p $OUT/regen-self-prompts
split -b 16000000 -d $ROOT/prepared/regenerated.jsonl.gz $OUT/regen-self-prompts/part
sha256sum $ROOT/prepared/regenerated.jsonl.gz
echo "self-prompts: answered ($(left) s left)"
