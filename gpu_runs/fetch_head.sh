#!/usr/bin/env bash
# Return a trained head through $OUT, which takes at most 8 files of 16 MiB, 64 MiB in all: one tar
# of the head folder (config.json, specheads.json, model.safetensors) and the run's metrics,
# summary and curves under train/, cut in 16 MB parts, COUNT parts a call (default 3: a SmolLM2
# head's 46 MB). A larger head (Qwen2.5-Coder-0.5B's, about 100 MB) takes more calls:
#   bash gpu_runs/fetch_head.sh RUN_DIR [FIRST_PART [COUNT]]   (it prints the next call's FIRST_PART)
# Here, once every part is in:
#   mkdir -p .dev/head && cat /work/.device/N/head/head.tar.part* [/work/.device/M/head/head.tar.part*] | tar -x -C .dev/head
set -euo pipefail
RUN=${1:?usage: fetch_head.sh RUN_DIR [FIRST_PART [COUNT]]}
FIRST=${2:-0}
COUNT=${3:-3}
mkdir -p $OUT/head /tmp/fetch_head/train
if [ ! -f /tmp/fetch_head/parts.done ] || [ $RUN/final/model.safetensors -nt /tmp/fetch_head/parts.done ]; then
  rm -rf /tmp/fetch_head/parts && mkdir -p /tmp/fetch_head/parts
  cp $RUN/metrics.jsonl $RUN/train_summary.json $RUN/train_curves.png /tmp/fetch_head/train/ 2>/dev/null || true
  tar -cf /tmp/fetch_head/head.tar -C $RUN/final config.json specheads.json model.safetensors -C /tmp/fetch_head train
  sha256sum $RUN/final/model.safetensors /tmp/fetch_head/head.tar
  split -b 16000000 -d /tmp/fetch_head/head.tar /tmp/fetch_head/parts/head.tar.part
  touch /tmp/fetch_head/parts.done
fi
parts=($(ls /tmp/fetch_head/parts))
n=${#parts[@]}
last=$(( FIRST + COUNT < n ? FIRST + COUNT : n ))
for i in $(seq $FIRST $(( last - 1 ))); do cp /tmp/fetch_head/parts/${parts[$i]} $OUT/head/; done
if [ $last -lt $n ]; then
  echo "fetch_head: parts $FIRST-$(( last - 1 )) of $n returned; next call: bash gpu_runs/fetch_head.sh $RUN $last"
else
  echo "fetch_head: parts $FIRST-$(( n - 1 )) of $n returned (the last)"
fi
