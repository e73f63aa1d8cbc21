#!/usr/bin/env bash
# Carry a head folder too large for one device call (a call carries at most 64 MiB with the working tree;
# the Qwen2.5-Coder-0.5B head's model.safetensors is 94 MB) in parts, one or more a call, and join it there.
#   here, once:   bash gpu_runs/stage_head.sh split HEAD_DIR STAGE_DIR [PART_BYTES]
#                 -> STAGE_DIR/p00/part00, STAGE_DIR/p01/part01, ... (PART_BYTES each, default 47,300,000)
#                    and STAGE_DIR/meta/ (the folder's other files and SHA256: the weights' sha256 and size)
#   there, each call carrying STAGE_DIR/meta and one or more STAGE_DIR/pNN (a part may ride beside
#   another file's chunk, e.g. the last chunk of the GGUF, `gpu_runs/stage_qwen.sh`):
#                 bash gpu_runs/stage_head.sh join STAGE_DIR DEST_DIR
#                 copies the carried parts to $HEAD_STAGE/<DEST name>/ (HEAD_STAGE: /tmp/head-stage); once their
#                 sizes add up to the weights' it joins them into DEST_DIR/model.safetensors, checks the sha256,
#                 copies the other files and prints "stage_head: DEST_DIR ready". A call that finds DEST_DIR
#                 checked says so.
set -euo pipefail
case "${1:-}" in
  split)
    SRC=${2:?usage: stage_head.sh split HEAD_DIR STAGE_DIR [PART_BYTES]}
    OUT=${3:?usage: stage_head.sh split HEAD_DIR STAGE_DIR [PART_BYTES]}
    BYTES=${4:-47300000}
    [ -f "$SRC/model.safetensors" ] || { echo "stage_head: $SRC has no model.safetensors" >&2; exit 2; }
    rm -rf "$OUT" && mkdir -p "$OUT/meta" "$OUT/tmp"
    split -b "$BYTES" -d "$SRC/model.safetensors" "$OUT/tmp/part"
    for part in "$OUT"/tmp/part*; do
      n=${part##*/part}
      mkdir -p "$OUT/p$n" && mv "$part" "$OUT/p$n/part$n"
    done
    rmdir "$OUT/tmp"
    for f in "$SRC"/*; do [ "${f##*/}" = model.safetensors ] || cp "$f" "$OUT/meta/"; done
    echo "$(sha256sum "$SRC/model.safetensors" | cut -d' ' -f1) $(stat -c %s "$SRC/model.safetensors")" > "$OUT/meta/SHA256"
    echo "stage_head: $(ls -d "$OUT"/p* | wc -l) part(s) of at most $BYTES bytes in $OUT (carry $OUT/meta with each)" ;;
  join)
    SRC=${2:?usage: stage_head.sh join STAGE_DIR DEST_DIR}
    DEST=${3:?usage: stage_head.sh join STAGE_DIR DEST_DIR}
    STAGE=${HEAD_STAGE:-/tmp/head-stage}/$(basename "$DEST")
    if [ -f "$STAGE.ok" ] && [ -f "$DEST/model.safetensors" ]; then echo "stage_head: $DEST ready (checked before)"; exit 0; fi
    [ -f "$SRC/meta/SHA256" ] || { echo "stage_head: carry $SRC/meta (its SHA256) with each part" >&2; exit 2; }
    read -r SHA SIZE < "$SRC/meta/SHA256"
    mkdir -p "$DEST"
    source "$(dirname "$0")/join_parts.sh"
    rc=0; join_parts stage_head "$STAGE" "$DEST/model.safetensors" "$SIZE" "$SHA" "$SRC"/p[0-9]*/part[0-9]* || rc=$?
    if [ $rc -eq 3 ]; then exit 0; fi  # parts still to come
    [ $rc -eq 0 ] || exit 1
    for f in "$SRC"/meta/*; do [ "${f##*/}" = SHA256 ] || cp "$f" "$DEST/"; done
    touch "$STAGE.ok"
    echo "stage_head: $DEST ready" ;;
  *) echo "stage_head.sh: split or join, not '${1:-}'" >&2; exit 2 ;;
esac
