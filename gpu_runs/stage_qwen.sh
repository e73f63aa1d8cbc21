#!/usr/bin/env bash
# Stage a Qwen2.5-Coder GGUF on the device machine, one chunk a call (a call carries at most
# 64 MiB with the working tree; the 0.5B's 491 MB go in 10 chunks of 52 MB, the 1.5B's 1.1 GB in 22).
#   here, once:  bash scripts/fetch_qwen_pair.sh --split   (.dev/qwen/split-SIZE/partNN and SHA256)
#   calls, back to back (the machine stays warm ~30 s between calls), chunk NN carried with SHA256:
#       carry [".dev/qwen/split-0.5b/partNN", ".dev/qwen/split-0.5b/SHA256"]
#       bash gpu_runs/stage_qwen.sh 0.5b
#   Each call copies the carried chunk to /tmp/qstage/SIZE/; once every chunk is there (their sizes
#   add up to the GGUF's, read from SHA256's file name through scripts/fetch_qwen_pair.sh's table)
#   it joins them into /tmp/gguf/<name>.gguf, checks the sha256 and prints "stage_qwen: SIZE ready"
#   and the path (set TARGET to it before sourcing gpu_runs/env.sh). A call that finds the joined GGUF
#   already checked says so and does nothing else.
set -euo pipefail
SIZE=${1:?usage: stage_qwen.sh 0.5b|1.5b}
SRC=.dev/qwen/split-$SIZE
STAGE=/tmp/qstage/$SIZE
mkdir -p /tmp/gguf
[ -f "$SRC/SHA256" ] || { echo "stage_qwen: carry $SRC/SHA256 with each chunk" >&2; exit 2; }
read -r SHA FILE < "$SRC/SHA256"
GGUF=/tmp/gguf/$FILE
if [ -f "$GGUF.ok" ]; then echo "stage_qwen: $SIZE ready: $GGUF (checked before)"; exit 0; fi
# the GGUF's size, from the fetch script's table (the one place the sizes are written)
BYTES=$(grep -E "^  \"$SIZE " scripts/fetch_qwen_pair.sh | awk '{print $5}')
[ -n "$BYTES" ] || { echo "stage_qwen: no size for $SIZE in scripts/fetch_qwen_pair.sh" >&2; exit 2; }
source "$(dirname "$0")/join_parts.sh"
rc=0; join_parts stage_qwen "$STAGE" "$GGUF" "$BYTES" "$SHA" "$SRC"/part[0-9][0-9] || rc=$?
if [ $rc -eq 3 ]; then exit 0; fi  # chunks still to come
[ $rc -eq 0 ] || exit 1
touch "$GGUF.ok"
echo "stage_qwen: $SIZE ready: $GGUF"
