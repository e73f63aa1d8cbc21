#!/usr/bin/env bash
# Graphed == eager for every method at batch 1 and 8, each in its own process (a device-side
# assert poisons the process), with synchronous launches so a failure names its kernel.
source gpu_runs/env.sh
export CUDA_LAUNCH_BLOCKING=1
for m in ${METHODS:-ar eagle3-chain eagle3-tree ngram}; do
  for b in ${BATCHES:-1 8}; do
    python3 gpu_runs/selfcheck.py .dev/head $m $b ${TOKENS:-256} 2>&1 | grep -v -i "warn\|Assertion\|shards" | tail -${LINES_PER:-6}
  done
done
