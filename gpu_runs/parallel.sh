#!/usr/bin/env bash
# Run independent GPU jobs at once, job i alone on GPU i, each with its own OUT folder and log;
# everything comes back as one tar ($OUT holds 8 files at most) beside each log's tail.
#   bash gpu_runs/parallel.sh "JOB 0 COMMAND" "JOB 1 COMMAND" ...
# Each command runs under bash with gpu_runs/env.sh sourced, CUDA_VISIBLE_DEVICES=i and
# OUT=/tmp/parallel/jobI; JOB_LIMIT (s, default 560) stops a job that runs too long.
# Here: mkdir -p R && tar -xzf FILES_AT/results.tgz -C R
set -uo pipefail
source gpu_runs/env.sh
ngpu=$(nvidia-smi -L | wc -l)
[ $# -le "$ngpu" ] || { echo "parallel.sh: $# jobs but $ngpu GPU(s) here" >&2; exit 2; }
nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee $OUT/gpu.txt
ROOT=/tmp/parallel
rm -rf $ROOT && mkdir -p $ROOT
pids=()
for i in $(seq 0 $(( $# - 1 ))); do
  n=$(( i + 1 ))
  mkdir -p $ROOT/job$i
  echo "${!n}" > $ROOT/job$i/command.txt
  CUDA_VISIBLE_DEVICES=$i OUT=$ROOT/job$i timeout -s TERM -k 15 ${JOB_LIMIT:-560} \
    bash -c "source gpu_runs/env.sh; ${!n}" > $ROOT/job$i/log.txt 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait ${pids[$i]}; echo "job$i rc $?" | tee -a $ROOT/rc.txt
done
tar -czf $OUT/results.tgz -C $ROOT .
for i in "${!pids[@]}"; do
  echo "=== job$i: $(cat $ROOT/job$i/command.txt)"
  grep -v -i -E "warn|Assertion|it/s\]|s/it\]" $ROOT/job$i/log.txt | tail -${TAIL:-25}
done
