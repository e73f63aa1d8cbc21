#!/usr/bin/env bash
# Return a trained head through $OUT (files come back at most 16 MiB each): config, metadata
# and model.safetensors in 15 MB parts.  Here: cat .device/N/head/model.part* > model.safetensors
set -euo pipefail
RUN=${1:?usage: fetch_head.sh RUN_DIR}
mkdir -p $OUT/head
cp $RUN/final/config.json $RUN/final/specheads.json $OUT/head/
split -b 15000000 -d $RUN/final/model.safetensors $OUT/head/model.part
sha256sum $RUN/final/model.safetensors | tee $OUT/head/model.sha256
