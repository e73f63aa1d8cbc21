#!/usr/bin/env bash
# The decoding benchmark (bench.sh) and the serving load test (serve_load.sh) with one head.
# On a machine of 2+ GPUs they run side by side, the benchmark on GPU 0 and the server on GPU 1
# (each alone on its card; they share the host's CPUs); else one after the other.
#   HEAD=.dev/head bash gpu_runs/bench_and_serve.sh "BENCH ARGS" "SERVE ARGS"
set -uo pipefail
HEAD=${HEAD:-.dev/head}
BENCH_ARGS=${1:---methods ar eagle3-chain eagle3-tree ngram --verify-shape llama-8b}
SERVE_ARGS=${2:---requests 96 --max-seconds 20}
if [ "$(nvidia-smi -L | wc -l)" -gt 1 ]; then
  CUDA_VISIBLE_DEVICES=1 HEAD=$HEAD bash gpu_runs/serve_load.sh $HEAD $SERVE_ARGS > $OUT/serve_load.log 2>&1 &
  SERVE=$!
  CUDA_VISIBLE_DEVICES=0 HEAD=$HEAD bash gpu_runs/bench.sh $BENCH_ARGS 2>&1 | tee $OUT/bench.log
  wait $SERVE
else
  HEAD=$HEAD bash gpu_runs/bench.sh $BENCH_ARGS 2>&1 | tee $OUT/bench.log
  HEAD=$HEAD bash gpu_runs/serve_load.sh $HEAD $SERVE_ARGS > $OUT/serve_load.log 2>&1
fi
tail -25 $OUT/serve_load.log
