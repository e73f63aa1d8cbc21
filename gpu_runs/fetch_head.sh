#!/usr/bin/env bash
# Return a trained head through $OUT, which takes at most 8 files of 16 MiB: one tar of the head
# folder (config.json, specheads.json, model.safetensors) and the run's metrics, summary and
# curves under train/, split in 16 MB parts. Here:
#   mkdir -p .dev/head && cat /work/.device/N/head/head.tar.part* | tar -x -C .dev/head
set -euo pipefail
RUN=${1:?usage: fetch_head.sh RUN_DIR}
mkdir -p $OUT/head /tmp/fetch_head/train
cp $RUN/metrics.jsonl $RUN/train_summary.json $RUN/train_curves.png /tmp/fetch_head/train/ 2>/dev/null || true
tar -cf /tmp/fetch_head/head.tar -C $RUN/final config.json specheads.json model.safetensors -C /tmp/fetch_head train
sha256sum $RUN/final/model.safetensors /tmp/fetch_head/head.tar
split -b 16000000 -d /tmp/fetch_head/head.tar $OUT/head/head.tar.part
