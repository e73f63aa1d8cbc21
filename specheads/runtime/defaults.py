"""Runtime defaults shared by the engine, the CLI, the server and the scripts (no torch import)."""

# the default draft tree of a head (num_steps, topk, num_draft_tokens): the best of a sweep of ~28 shapes
# on an H200 with SmolLM2-135M-Instruct and its current head (6,4,15 2.87x our ar at batch 1 and
# 1.63x at batch 8, 7,8,40 2.76x and 1.55x, 7,8,31 2.84x and 1.34x; docs/history/2026-11-benchmark-log.md).
# A 15-node tree verifies as 16 rows, one row block of the projections, where 41 rows take
# three; topk 4 keeps each depth's expansion small. Deeper or wider trees accept more tokens a
# step but cost more than they gain once the draft and the verify are this cheap. (Chosen on
# six held-out ShareGPT prompts, before the evaluation suite existed: the suite's validation
# split is where the next choice is made.)
DEFAULT_TREE = (6, 4, 15)
TREE_DEFAULT_HELP = ("default: the head's tree (specheads.json, chosen on the validation split), else its kind's "
                     "(medusa: 2,8,12), else 6,4,15")


def tree_pool(num_steps: int, topk: int) -> int:
    """The candidates a dynamic tree of this depth and branching chooses its nodes from: the root's
    topk children, then topk x topk children of a depth's topk frontier nodes per deeper depth (the
    most nodes such a tree can hold)."""
    return topk + (num_steps - 1) * topk * topk


def resolve_tree(num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
                 head=None) -> tuple[int, int, int]:
    """The tree a run drafts with: each value given wins; the rest come from the head's own tree
    (`head.tree`: its folder's specheads.json, or else its kind's default) or else from DEFAULT_TREE."""
    base = getattr(head, "tree", None) or DEFAULT_TREE
    return tuple(v if v is not None else b for v, b in zip((num_steps, topk, num_draft_tokens), base))

# alternatives a request may ask for at each emitted token (top_logprobs)
MAX_TOP_LOGPROBS = 20
