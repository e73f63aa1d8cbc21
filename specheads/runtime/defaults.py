"""Runtime defaults shared by the engine, the CLI, the server and the scripts (no torch import)."""

# the default EAGLE-3 tree (num_steps, topk, num_draft_tokens): the best of a sweep on an H200
# with SmolLM2-135M-Instruct and its session-8 head (docs/benchmarks.md: 7,8,40 2.93x our ar,
# 6,8,32 2.64x, 8,8,64 2.56x); deeper or wider trees accept more tokens per step but cost more
# per step
DEFAULT_TREE = (7, 8, 40)
