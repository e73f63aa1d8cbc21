"""The acceptance a served request would see, estimated without the decode loop.

Greedy speculative decoding emits the target's own greedy continuation, so which steps it takes
is decided by the continuation alone: a step rooted at position L (the last emitted token)
drafts a tree from the drafter's state after the tokens up to L, and accepts the longest path of
the tree that spells the continuation's next tokens. Here that state is made teacher-forced:
one target forward over prompt + continuation gives the features at every position, and the
drafter is prefilled once per root position (a row each, the sequence cut at L, the root as the
first generated token) and proposes once; the tree is scored against the continuation with
the engine's accept walk. Walking from the end of the prompt, a step at L emits its accepted
drafts and the bonus token (never past the continuation's end) and the next step is rooted
where it stopped: the mean acceptance length is what the engine reports for the same prompts,
up to where the drafter's own arithmetic would round a near-tie differently in a step than in
its prefill. With the n-gram assist's gated long chain (`ngram_gate_chain`, drafters/assist.py), a
root whose lookup matched is scored with that chain, as a batch-1 step would verify it, and with its
ladder (`ngram_gate_long`) a gated step right after a fully accepted gated one with the ladder's chain.
"""

from __future__ import annotations

import torch

from specheads.drafters import DraftContext, DraftSetup, PrefillBatch, build_drafter
from specheads.kernels.verify import accept, ancestors_reference

PREFILL_TOKENS = 16384  # the drafter's prefill of one chunk of roots: at most this many tokens (rows x width)


def root_chunks(roots: list[int], rows: int, tokens: int | None = None) -> list[list[int]]:
    """Consecutive roots in chunks of at most `rows` roots whose prefill (each cut at its root,
    the longest one's width for all) stays within `tokens` tokens (at least one root a chunk):
    a long conversation's roots would otherwise prefill rows x thousands of tokens at once."""
    tokens = PREFILL_TOKENS if tokens is None else tokens
    chunks: list[list[int]] = []
    for r in roots:
        if chunks and len(chunks[-1]) < rows and (len(chunks[-1]) + 1) * r <= tokens:
            chunks[-1].append(r)
        else:
            chunks.append([r])
    return chunks


def prefilled_roots(drafter, target, sequence: list[int], start: int, rows: int = 64, tokens: int | None = None):
    """For the step roots L in [start, len(sequence) - 1), in chunks (root_chunks: at most `rows` rows
    and `tokens` prefill tokens a chunk): the drafter prefilled teacher-forced, a row per root (the
    sequence cut at L, the root as the first generated token), then yields (roots [k], the sequence
    as a tensor, the step's DraftContext); the rows are cleared before the next chunk. Call under
    torch.no_grad()."""
    dev = next(target.parameters()).device
    seq = torch.tensor(sequence, device=dev)
    n = len(sequence)
    out = target(seq[None], capture_layers=drafter.needs.capture_layers, return_logits=False)
    for part in root_chunks(list(range(start, n - 1)), rows, tokens):
        chunk = torch.tensor(part, device=dev)
        k = len(chunk)
        width = int(chunk.max())
        ids = seq[None, :width].expand(k, width).contiguous()
        feats = out.aux_hidden[:, :width].expand(k, -1, -1) if out.aux_hidden is not None else None
        drafter.prefill(PrefillBatch(0, ids, chunk, seq[chunk], feats, out.hidden[:, :width].expand(k, -1, -1)))
        yield chunk, seq, DraftContext(k, drafter_kv(drafter, n), seq[chunk],
                                       [sequence[: int(r) + 1] for r in chunk] if drafter.needs.history else None)
        for r in range(k):
            drafter.clear_row(r)


def following(seq: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """The sequence's token at each position of `at` (-1 past its end): the target's token after a
    node at sequence position at - 1."""
    n = len(seq)
    return torch.where(at < n, seq[at.clamp(max=n - 1)], torch.full_like(at, -1)).contiguous()


def accepted_per_position(drafter, target, sequence: list[int], start: int, rows: int = 64,
                          tokens: int | None = None, chains: list[int] | None = None) -> list[int]:
    """Accepted drafts of a step rooted at each position L in [start, len(sequence) - 1): the
    length of the tree's path that spells sequence[L + 1:], minus the root. Roots are scored in
    chunks (root_chunks: at most `rows` rows and `tokens` prefill tokens a chunk). `chains` (a list,
    filled where the drafter has a ladder, `ladder`): per root, the drafts of the lookup's chain up to
    the ladder's length that spell the sequence, -1 where the lookup does not match."""
    result: list[int] = []
    long = long_chain(drafter)
    gate_long = ladder(drafter)[1]
    if gate_long and chains is None:
        raise ValueError("a drafter with a ladder (ngram_gate_long) is scored with chains=[] (ladder_walk walks it)")
    dev = next(target.parameters()).device
    cols = torch.arange(max(long, gate_long), device=dev) if long else None
    with torch.no_grad():
        for chunk, seq, ctx in prefilled_roots(drafter, target, sequence, start, rows, tokens):
            tree = drafter.propose(ctx)
            dev = seq.device
            tokens_, parents, valid, depth = (t.to(dev).contiguous() for t in (tree.tokens, tree.parents, tree.valid,
                                                                                tree.depth))
            # the target's token after each node, as far as the continuation goes (-1: nothing matches)
            y = following(seq, chunk[:, None] + depth + 1)
            anc = ancestors_reference(parents, tree.max_depth).contiguous()
            _, length, _, _ = accept(tokens_, parents, valid, depth, anc, y, tree.max_depth)
            accepted = length - 1
            if long:  # a matched root's step is gated: the lookup's chain of up to `long` drafts
                chain, found = lookup_accepted(drafter, ctx, seq, chunk, cols)
                # (not a request's first step: the engine gates a step behind a drafting one)
                gated = found & (chunk > start)
                accepted = torch.where(gated, chain.clamp(max=long), accepted)
                if gate_long:
                    chains += torch.where(gated, chain, -1).tolist()
            result += accepted.tolist()
    return result


def lookup_accepted(drafter, ctx: DraftContext, seq: torch.Tensor, chunk: torch.Tensor,
                    cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The n-gram assist's lookup at each root of `chunk` (its chain's columns `cols`): ([k] how many
    of the chain's drafts spell the sequence's next tokens, [k] bool whether the lookup matched)."""
    drafts, found = drafter.lookup.lookup(ctx, cols, drafter.min_ngram)
    want = following(seq, chunk[:, None] + 1 + cols)
    return torch.cumprod((drafts == want).long(), 1).sum(1), found


def long_chain(drafter) -> int:
    """The chain a gated batch-1 step verifies where it is longer than the tree's or followed by the
    ladder's (the n-gram assist's ngram_gate_chain and ngram_gate_long, its gate not turned off), else 0."""
    chain = getattr(drafter, "gate_chain", 0)
    longer = chain > getattr(drafter, "num_draft", 0) or getattr(drafter, "gate_long", 0)
    return chain if longer and getattr(drafter, "gate", 0) != 0 else 0


def ladder(drafter) -> tuple[int, int]:
    """(the gated chain, the ladder's chain) where the n-gram assist's gate runs its ladder
    (ngram_gate_long: a gated step right after a gated one that accepted every draft), else (0, 0)."""
    long, gate_long = long_chain(drafter), getattr(drafter, "gate_long", 0)
    return (long, gate_long) if long and gate_long else (0, 0)


def ladder_walk(accepted: list[int], chains: list[int], new_tokens: int, chain: int, long: int,
                kinds: dict | None = None) -> tuple[int, int]:
    """`walk` with the ladder: a gated root (chains[i] >= 0: the lookup matched, not the first step)
    verifies the gated chain of `chain` drafts, or of `long` right after a gated step that accepted
    every draft it verified. `kinds` (a dict) counts the steps by kind: "tree", "chain", "ladder"."""
    state = {"full": False}
    kinds = {} if kinds is None else kinds

    def pick(i: int) -> tuple[int, int]:
        if chains[i] < 0:
            state["full"] = False
            kinds["tree"] = kinds.get("tree", 0) + 1
            return accepted[i], 0
        n = long if state["full"] else chain
        kind = "ladder" if n > chain else "chain"
        kinds[kind] = kinds.get(kind, 0) + 1
        a = min(chains[i], n)
        state["full"] = a == n
        return a, 0

    steps, total, _ = walk_with(new_tokens, pick)
    return steps, total


def drafter_kv(drafter, n: int) -> int:
    """The context bucket a step over a sequence of n tokens reads (its tree past the end)."""
    return n + drafter.depth + 1


def walk_with(new_tokens: int, pick) -> tuple[int, int, float]:
    """(verify steps, accepted drafts, summed units) of serving `new_tokens` tokens, the first from the
    prefill, where `pick(i)` -> (drafts accepted, units spent) for a step rooted i tokens into the
    continuation. As the engine counts them, the last step's drafts count up to the budget only."""
    emitted, steps, total, units = 1, 0, 0, 0
    while emitted < new_tokens:
        a, u = pick(emitted - 1)
        a = min(a, new_tokens - emitted - 1)
        steps += 1
        total += a
        units += u
        emitted += a + 1
    return steps, total, units


def walk(accepted: list[int], new_tokens: int) -> tuple[int, int]:
    """(verify steps, accepted drafts) of serving `new_tokens` tokens with `accepted[i]` drafts accepted
    at a step rooted i tokens into the continuation (walk_with)."""
    steps, total, _ = walk_with(new_tokens, lambda i: (accepted[i], 0))
    return steps, total


def scoring_drafter(target, head, method: str, tree: dict, prompts: list[list[int]],
                    continuations: list[list[int]], rows: int = 64, options: dict | None = None):
    """A drafter of `method` with tree options {num_steps, topk, num_draft_tokens} and drafter
    `options`, prepared on the target's device with `rows` rows long enough for every prompt +
    continuation (for `accepted_per_position`)."""
    dev = next(target.parameters()).device
    # (as the batch-1 engine under the fixed policy builds it: the n-gram assist's gate and chain by it)
    drafter = build_drafter(method, DraftSetup(target, head, options=dict(options or {}), policy="fixed", **tree))
    if dev.type == "cuda":
        drafter.prepare(dev)
    longest = max(len(p) + len(c) for p, c in zip(prompts, continuations))
    drafter.allocate(rows, drafter_kv(drafter, longest) + 1, dev, next(target.parameters()).dtype)
    return drafter


def served_acceptance(target, head, method: str, tree: dict, prompts: list[list[int]],
                      continuations: list[list[int]], new_tokens: list[int] | None = None,
                      rows: int = 64, options: dict | None = None) -> list[dict]:
    """Per prompt: {"steps", "accepted_tokens", "mean_accept_length"} estimated for greedy serving
    of the first `new_tokens[i]` tokens (default: all) of `continuations[i]` (the target's own,
    best a tree's depth longer) with a drafter of `method` and tree options {num_steps, topk,
    num_draft_tokens} and drafter `options`."""
    drafter = scoring_drafter(target, head, method, tree, prompts, continuations, rows, options)
    out = []
    for i, (prompt, cont) in enumerate(zip(prompts, continuations)):
        n = len(cont) if new_tokens is None else min(new_tokens[i], len(cont))
        if n < 2:
            out.append({"steps": 0, "accepted_tokens": 0, "mean_accept_length": None})
            continue
        chains, (chain, long) = [], ladder(drafter)
        accepted = accepted_per_position(drafter, target, prompt + cont, len(prompt), rows, chains=chains)
        steps, total = ladder_walk(accepted, chains, n, chain, long) if long else walk(accepted, n)
        out.append({"steps": steps, "accepted_tokens": total, "mean_accept_length": 1 + total / steps})
    return out
