#!/usr/bin/env bash
# Batch-1 steps of this checkout and of an older one (carried in .dev/baseline), in turn on one GPU:
# the kernels, the device's idle time between them and the host's share of a step with its
# costliest Python functions (kernel_profile.py --host --gaps), at short contexts and in the
# 1,024-key bucket (--min-context 600). Files: $OUT/{new,old}_ctx{0,600}.json.
#   bash gpu_runs/host_profile.sh [METHODS...]     (default: ar eagle3-tree; carry .dev/head,
#                                                   .dev/prompts and .dev/baseline)
set -uo pipefail
source gpu_runs/env.sh
methods=${*:-ar eagle3-tree}
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
for ctx in 0 600; do
  for v in new old; do
    path=/tmp/site:$PWD
    [ $v = old ] && path=/tmp/site:$PWD/.dev/baseline
    PYTHONPATH=$path python3 gpu_runs/kernel_profile.py .dev/head --out $OUT --label ${v}_ctx$ctx \
      --batch-sizes 1 --methods $methods --host --gaps --min-context $ctx 2>&1 | grep -v -i -E "warn|Assertion"
  done
done
