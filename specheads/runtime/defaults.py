"""Runtime defaults shared by the engine, the CLI, the server and the scripts (no torch import)."""

# the default EAGLE-3 tree (num_steps, topk, num_draft_tokens): the best of a sweep on an H100
# with SmolLM2-135M-Instruct and its trained head (docs/benchmarks.md); deeper or wider trees
# accept more tokens per step but cost more per step
DEFAULT_TREE = (6, 8, 32)
