"""Runtime defaults shared by the engine, the CLI, the server and the scripts (no torch import)."""

# the default EAGLE-3 tree (num_steps, topk, num_draft_tokens): the best of a sweep on an H200
# with SmolLM2-135M-Instruct and its session-9 head (docs/benchmarks.md, session 11: 6,4,15
# 2.87x our ar at batch 1 and 1.63x at batch 8 on ShareGPT, 7,8,40 2.76x and 1.55x, 7,8,31 2.84x
# and 1.34x). A 15-node tree verifies as 16 rows, one row block of the projections, where 41
# rows take three; topk 4 keeps each depth's expansion small. Deeper or wider trees accept more
# tokens a step but cost more than they gain once the draft and the verify are this cheap.
DEFAULT_TREE = (6, 4, 15)
