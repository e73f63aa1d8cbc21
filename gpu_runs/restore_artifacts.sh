#!/usr/bin/env bash
# Bring back the large files that live only in this repository's history (added in one commit,
# removed in the next, so that they do not travel with every checkout or device call):
#   .dev/head/         the current EAGLE-3 head for SmolLM2-135M-Instruct: .dev/head-ft1 fine-tuned 3 more
#                      epochs (4x H200, `train.init_from`, lr 2e-4, the same loop-cut data)
#   .dev/head-ft1/     .dev/head-first fine-tuned 4 epochs on answers cut at their first repeated 32-gram
#   .dev/head-first/   the first full head (trained from random weights)
#   .dev/qwen-head/    the current EAGLE-3 head for Qwen2.5-Coder-0.5B-Instruct (1x H200: 2 epochs at lr 1e-3,
#                      then 2 more at 3e-4 from that head, on .dev/qwen-regen's data cut at repeated 32-grams)
#   .dev/qwen-regen/part00  the first user turn of every ShareGPT conversation answered by
#                      Qwen2.5-Coder-0.5B-Instruct itself (greedy, at most 512 new tokens), as
#                      `specheads prepare --regenerate --max-turns 1` wrote it (REGEN=.dev/qwen-regen for
#                      head_pipeline.sh)
# (the artifacts/ paths below are the names these files have in history and cannot change;
# docs/history/2026-11-benchmark-log.md)
#   .dev/regen/part00  ShareGPT answered by SmolLM2-135M-Instruct itself (greedy, every turn),
#                      regenerated.jsonl.gz as `specheads prepare --regenerate` wrote it (head_pipeline.sh
#                      prepares from it instead of regenerating; here: copy it to a .jsonl.gz name and
#                      pass that to `specheads prepare --data`)
#   .dev/regen-code-prompts/part00  the code prompts shipped with specheads (`--data code-prompts`) answered
#                      by SmolLM2-135M-Instruct the same way (kinds_pipeline.sh takes it for DATA_ code-prompts
#                      instead of answering them again: REGEN-SOURCE)
# Each file is checked against its sha256. Needs the full history (not a shallow clone).
set -euo pipefail
cd "$(dirname "$0")/.."
restore() {  # restore PATH_IN_HISTORY SHA256 DEST
  local rev
  rev=$(git log -1 --diff-filter=A --format=%H -- "$1")
  [ -n "$rev" ] || { echo "restore_artifacts: $1 is not in this repository's history (shallow clone?)" >&2; exit 1; }
  mkdir -p "$(dirname "$3")"
  git show "$rev:$1" > "$3"
  echo "$2  $3" | sha256sum -c -
}
restore_head() {  # restore_head PATH_IN_HISTORY SHA256 RESULTS_DIR DEST_DIR
  restore "$1" "$2" "$4/model.safetensors"
  cp "$3/config.json" "$3/specheads.json" "$4/"
}
restore_head artifacts/smollm2-135m-eagle3-s9.safetensors \
  638aec45dc27d1ea5b287088d8f8ec855f83b738d7647246ed1d563027e6cd02 docs/results/smollm2-eagle3-4xh200-ft2 .dev/head
restore_head artifacts/smollm2-135m-eagle3-s8.safetensors \
  8496b08e88ed0e9c3b41e3b51a41c1bab8151c2224cbf07133d1b227040f5dd2 docs/results/smollm2-eagle3-4xh200-ft1 .dev/head-ft1
restore_head artifacts/smollm2-135m-eagle3-s7.safetensors \
  b5953ba822dc2845096b72c3fe981d931f41e58ef488ada721292efad2a06897 docs/results/smollm2-eagle3-4xh200-first .dev/head-first
restore artifacts/sharegpt-regenerated-smollm2-135m-greedy.jsonl.gz \
  9dbe7b68b20d69d360cf4928af426560dd78c9c582865dfb348cec266c756ed3 .dev/regen/part00
restore_head artifacts/qwen2.5-coder-0.5b-eagle3.safetensors \
  d269c1078680955bdda58edaa684ece3402f3d32f1f687d906c6d5fa095ea4f8 docs/results/qwen-coder-0.5b-eagle3-h200 .dev/qwen-head
restore artifacts/sharegpt-first-turns-regenerated-qwen2.5-coder-0.5b-greedy.jsonl.gz \
  b147989a0113a09e2ea02e45f0891c203afa8af5f0399a86792f39c9f5b85d55 .dev/qwen-regen/part00
restore artifacts/code-prompts-regenerated-smollm2-135m-greedy.jsonl.gz \
  908d01fb48234bcee2ef9c1539ac55450b50b6ee8273615adfc04b59303b9847 .dev/regen-code-prompts/part00
