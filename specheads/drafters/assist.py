"""A device drafter's tree with prompt lookup beside it (method `KIND+ngram`, e.g. `eagle3+ngram`).

Each row of a step drafts one of two things in the same verify shape (1 + num_draft nodes): where
its history's suffix of at least `min_ngram` tokens occurred before (the device n-gram lookup,
drafters/ngram.py), the chain of the tokens that followed it, as long as the tree has draft
nodes; elsewhere the head's tree. A repeated passage (code that restates a signature, a list that
repeats its pattern, a model that loops) is then drafted far past the head's depth at no draft
cost, and the head keeps every other step. The choice is made per row on the device, inside the
captured step: no host sync, and the next step still runs ahead.

The head's drafter drafts every step (its tree is dropped in the rows that take the chain), and it
commits every accepted path, so its state follows the text whichever draft won; a path may then be
as deep as the chain (`Drafter.accept_depth`). The output is the target's whatever is drafted.

The gate (option `ngram_gate` N: batches of up to N rows; 0 = off; unset, 1 under the fixed and the
adaptive policy, off under another, `SpecEngine.gate_rows`): where a row takes
the chain, the head's tree of that step is drafted for nothing; about 29% of the assisted steps take it
at batch 1 (SmolLM2-135M, the validation prompts' replay, chat and coding alike), and on an H200 the
head's six depths are about a fifth of such a step. With the gate, each drafting step also writes
whether each row's lookup matches at its new root; a drafting step planned behind it (the full tree's,
or under the adaptive policy any tier's), in a batch of at most N rows, waits for it, and where every row matches runs `lookup_only()`: the same chain,
verify and commit, with the head only taking in the path. The wait gives up the run-ahead of the
steps it checks. Measured at batch 1 (one H200, 2026-12-03, median of 3, docs/benchmarks.md): 6,4,15
+1.2% on chat (128 test prompts) and +2.0% on coding (64), 6,4,31 +2.3% and +0.9%; hence on at
batch 1 under the fixed policy. The adaptive policy with it ran 2.91x `ar` at coding batch 1 against
3.10x without (paced, another call of the same card), and with the long chain below 3.10x where the
fixed engine ran 3.26x, the full tier chosen at every step. Measured again on 2026-12-04 (night, one
H200, one call, 64 test prompts a set, median of 3): adaptive with the gate ran 0.991 of the fixed
engine on chat and on coding, without it 0.955 and 0.951; so on under the adaptive policy too. (Its
long chain had made every step of a wider batch feed the head 32 entries a row, a gated path's,
which only a step right after a gated one can need: the engine now feeds the tree's width otherwise,
`SpecEngine._fed`.)
Wider batches rarely have every row matching at once, and each wait would cost them the
run-ahead: not measured there, so not gated. With `ngram_gate_chain` C (more than the tree's N
drafts), a gated step verifies a chain of up to C drafts in its own verify shape (C + 1 nodes) while
every other step keeps the tree's N + 1: a repeated passage is drafted C deep without every step
paying a wider tree (on an H200 at batch 1 the 6,4,31 tree's step cost 12% more than 6,4,15's). The
engine's depth is then C (a gated path is that deep). Unset, C is GATE_CHAIN (31) wherever the gate
is on: chosen on the suite's validation part among 6,4,15, 6,4,31 (both gated) and 6,4,15 with a
31 chain (one H200, 2026-12-03, batch 1: chat 2.76x / 2.69x / 2.84x `ar`, coding 3.23x / 3.29x /
3.35x), then on the test part chat 3.03x to 3.11x and coding 3.18x to 3.26x over 6,4,15 gated;
median of 3 runs at batch 1 coding 3.04x to 3.23x, chat 2.78x to 2.79x, and at batch 8 (the gate
off there) within the runs' spread (-0.7%, -1.7%; docs/benchmarks.md).

The ladder (option `ngram_gate_long` L, more than the gated chain; 0 = off): a gated step right after
a gated step whose rows all drafted and accepted its whole chain runs a chain of L drafts in a verify
shape of its own (L + 1 nodes); any other gated step keeps the gated chain (a request whose own draft
limit cuts the chain never takes the ladder). An answer that copies a long passage (code restated
with an edit, a quoted document) then takes L + 1 tokens a step once the copy is under way, while a
step that copies a little pays no wider verify. Unset, L is GATE_LONG (63) wherever the gate is on,
the gated chain is shorter and the sequence leaves room for it: chosen on the suite's validation part
among no ladder, 63 and 127 (one H200, 2026-12-05, batch 1: chat 2.79x / 2.81x / 2.77x `ar`, coding
3.29x / 3.36x / 3.30x), then on the test part chat 3.05x to 3.12x and coding 3.16x to 3.30x against
no ladder in one run, coding 3.17x and 3.16x in a median of 3 (docs/benchmarks.md).

Chosen on the evaluation suite's validation prompts (SmolLM2-135M-Instruct and its EAGLE-3 head,
the tree 6,4,15, replayed from teacher-forced traces; gpu_runs/README.md): a suffix match of 3
tokens or more (max_ngram 4) served 4.33 tokens a step against the tree's 3.53 over 8 prompts of every
category, and 4.94 against 4.03 over 40 coding prompts; a match of one or two tokens is right too rarely to beat the tree.
"""

from __future__ import annotations

import torch

from specheads.drafters.base import Abilities, DraftContext, Drafter, PrefillBatch, StepResult
from specheads.drafters.ngram import DeviceNgramDrafter
from specheads.runtime.policy import TreeShape
from specheads.runtime.tree import Tree, chain_tree

SUFFIX = "+ngram"  # method KIND+ngram: KIND's drafter with the lookup beside it
MAX_NGRAM = 4
GATE = None  # the gate's default: unset, the engine's choice by its policy (module doc, "The gate")
GATE_CHAIN = 31  # the gated step's chain where the gate is on and ngram_gate_chain is not given (module doc)
GATE_LONG = 63  # the ladder's chain where the gate is on and ngram_gate_long is not given (module doc)
MIN_NGRAM = 3
OPTIONS = ("ngram_max", "ngram_min", "ngram_gate", "ngram_gate_chain", "ngram_gate_long")  # drafter options the assist takes (the rest go to the head's drafter)


def default_gate(policy: str | None) -> int:
    """The gate where ngram_gate is not given (module doc, "The gate"): batches of one row under the
    fixed and the adaptive policy, off under any other (a custom policy's)."""
    return 1 if policy in ("fixed", "adaptive") else 0


def gate_off(chain: int, policy: str | None, option: str = "ngram_gate_chain") -> str:
    """Why a chain longer than the tree's is refused where the gate is off by the policy's default."""
    return (f"{option}={chain} lengthens the gate's chain, and the gate is off under the {policy} policy "
            f"unless asked: add ngram_gate=1")


def resolve_options(options: dict, policy: str | None, room: int | None = None) -> dict:
    """The assist's options as an engine under `policy` runs it (module doc, "The gate"): the gate
    unset is 1 under the fixed and the adaptive policy (`default_gate`); the gated chain unset is
    GATE_CHAIN where the gate is on and a step may reach that far past the engine's longest
    sequence (`room` positions; None: no limit), else the tree's; the ladder unset is off where the
    room does not reach GATE_LONG past it (elsewhere `NgramAssist` settles it). Without a policy (a
    drafter built outside an engine) the gate stays unset, for the engine to settle, the chain is the
    tree's and there is no ladder."""
    out = dict(options)
    if policy is None:
        return out
    if out.get("ngram_gate") is None:
        out["ngram_gate"] = default_gate(policy)
        if not out["ngram_gate"] and out.get("ngram_gate_chain"):
            raise ValueError(gate_off(out["ngram_gate_chain"], policy))
    if out.get("ngram_gate_chain") is None and out["ngram_gate"]:
        out["ngram_gate_chain"] = GATE_CHAIN if room is None or room > GATE_CHAIN else 0
    long = out.get("ngram_gate_long")
    if long is None and out["ngram_gate"] and room is not None and room <= GATE_LONG:
        out["ngram_gate_long"] = 0  # (no default ladder where the engine leaves it no room)
    if long and room is not None and room <= long:
        raise ValueError(f"ngram_gate_long={long} needs room past the longest sequence for its chain; this engine "
                         f"has {room} (raise max_len, or give a shorter ngram_gate_long)")
    return out


def split_method(method: str | None) -> tuple[str | None, bool]:
    """('eagle3', True) for 'eagle3+ngram'; (method, False) otherwise."""
    if method and method.endswith(SUFFIX) and len(method) > len(SUFFIX):
        return method[: -len(SUFFIX)], True
    return method, False


class NgramAssist(Drafter):
    """`inner` (a device drafter) drafts its tree; rows whose suffix matched `min_ngram` tokens or
    more draft the lookup's chain instead (see the module doc). depth: the deeper of the head's
    tree and the chain (num_draft tokens)."""

    def __init__(self, inner: Drafter, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM,
                 chain: int | None = None, _shared: DeviceNgramDrafter | None = None, gate: int | None = GATE,
                 gate_chain: int = 0, gate_long: int | None = None):
        if not inner.abilities.on_device:
            raise ValueError(f"the n-gram assist needs a drafter that drafts on the device; {type(inner).__name__} "
                             "drafts on the host")
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"ngram_min must be in [1, ngram_max={max_ngram}], got {min_ngram}")
        if gate is not None and (not isinstance(gate, int) or isinstance(gate, bool) or gate < 0):
            raise ValueError(f"ngram_gate must be a batch size >= 0 (0: off), got {gate!r}")
        if not isinstance(gate_chain, int) or isinstance(gate_chain, bool) or gate_chain < 0:
            raise ValueError(f"ngram_gate_chain must be a draft count >= 0 (0: the tree's), got {gate_chain!r}")
        if gate_chain and gate == 0:
            raise ValueError("ngram_gate_chain sets the chain of the gate's steps: it needs the gate (ngram_gate >= 1)")
        if gate_long is None:  # the default: GATE_LONG where the gate is on and its chain shorter
            gated = max(gate_chain, inner.num_draft if chain is None else chain)
            gate_long = GATE_LONG if gate and GATE_LONG > gated else 0
        if not isinstance(gate_long, int) or isinstance(gate_long, bool) or gate_long < 0:
            raise ValueError(f"ngram_gate_long must be a draft count >= 0 (0: off), got {gate_long!r}")
        if gate_long and gate == 0:
            raise ValueError("ngram_gate_long sets the chain of a gated step after a fully accepted one: it needs the "
                             "gate (ngram_gate >= 1)")
        # the engine's gate (module doc, "The gate"): up to this many rows, a drafting step whose rows
        # all match runs `lookup_only()` instead (0: never), a chain of `gate_chain` drafts
        self.gate = gate
        self.inner = inner
        self.chain = inner.num_draft if chain is None else chain
        self.gate_chain = max(gate_chain, self.chain)
        if gate_long and gate_long <= self.gate_chain:
            raise ValueError(f"ngram_gate_long={gate_long} must be longer than the gated chain ({self.gate_chain} "
                             f"drafts), or 0 (off)")
        # the ladder (module doc, "The ladder"): a gated step right after a gated one whose rows accepted
        # every draft verifies a chain of `gate_long` drafts (0: never)
        self.gate_long = gate_long
        self.num_draft = inner.num_draft
        self.topk = inner.topk
        self.depth = max(inner.depth, self.chain, self.gate_chain, self.gate_long)
        self.needs = inner.needs
        self.abilities = Abilities(on_device=True, trees=True, tiers=inner.abilities.tiers)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # the row state of the lookup (every token of each row), shared by the tiers
        self.lookup = _shared or DeviceNgramDrafter(self.depth, max_ngram)
        if _shared is None:
            inner.accept_depth(self.depth)

    # ................................................................ state: both drafters'
    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        return self.inner.memory_bytes(rows, cap, elem) + self.lookup.memory_bytes(rows, cap, elem)

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        self.inner.allocate(rows, cap, device, dtype)
        self.lookup.allocate(rows, cap, device, dtype)
        self._allocate_chain(device)

    def _allocate_chain(self, device) -> None:
        n, c = self.num_draft, self.chain
        self.cols = torch.arange(c, device=device)
        # the chain's shape in the tree's n + 1 nodes: a path of c drafts, padding nodes after it
        node = torch.arange(n + 1, device=device)
        self.chain_parents = torch.where(node <= c, node - 1, 0)[None]
        self.chain_depth = torch.where(node <= c, node, 1)[None]
        self.chain_open = (node <= c)[None]
        self.chain_rank = node[None]

    def prepare(self, device) -> None:
        self.inner.prepare(device)

    def state(self) -> list[torch.Tensor]:
        return self.inner.state() + self.lookup.state()

    def move_row(self, src: int, dst: int, length: int) -> None:
        self.inner.move_row(src, dst, length)
        self.lookup.move_row(src, dst, length)

    def clear_row(self, row: int) -> None:
        self.inner.clear_row(row)
        self.lookup.clear_row(row)

    def park_rows(self, start: int, stop: int) -> None:
        self.inner.park_rows(start, stop)
        self.lookup.park_rows(start, stop)

    def full_drafts(self):
        return self.inner.full_drafts()

    def tier(self, shape: TreeShape) -> "NgramAssist":
        """A tier s,k,n: the chain of min(s, n) drafts, or the head's tree of min(s, its depth),k,n (a
        chain tier deeper than the head: the head's chain as deep as it drafts, padded)."""
        steps = min(shape.steps, self.inner.depth)
        inner = self.inner.tier(TreeShape(steps, 1, steps) if shape.topk == 1 else
                                TreeShape(steps, shape.topk, shape.num_draft))
        tier = NgramAssist(inner, self.max_ngram, self.min_ngram, min(shape.steps, shape.num_draft), self.lookup,
                           gate_long=0)
        tier.num_draft = shape.num_draft
        tier._allocate_chain(self.cols.device)
        return tier

    def lookup_only(self, long: bool = False) -> "LookupChain":
        """The full tree's step without the head's tree, for a step whose rows all take the chain: a
        chain of `gate_chain` drafts (the tree's draft count unless ngram_gate_chain says more), or with
        `long` of `gate_long` (the ladder's)."""
        n = self.gate_long if long else self.gate_chain
        twin = LookupChain(self.inner, self.max_ngram, self.min_ngram, n, self.lookup, gate_long=0)
        twin.num_draft = n
        twin._allocate_chain(self.cols.device)
        return twin

    def next_found(self, ctx: DraftContext) -> torch.Tensor:
        """[b] bool, after a step's commit (`ctx`: that step's context bucket, which held its tree, so
        it holds each row's new root): whether each row's lookup matches at its new root, as the next
        step's lookup will (its matches lie before the root, whatever bucket that step reads)."""
        return self.lookup.lookup(ctx, self.cols[:1], self.min_ngram)[1]

    # ................................................................ the step
    def prefill(self, batch: PrefillBatch) -> None:
        self.inner.prefill(batch)
        self.lookup.prefill(batch)

    def keep_up(self, ctx: DraftContext, wide: bool = True) -> None:
        self.inner.keep_up(ctx, wide)

    def commit(self, step: StepResult) -> None:
        self.inner.commit(step)
        self.lookup.commit(step)

    def propose(self, ctx: DraftContext) -> Tree:
        tree = self.inner.propose(ctx)
        b = ctx.rows
        drafts, found = self.lookup.lookup(ctx, self.cols, self.min_ngram)
        take = found[:, None]
        n1 = self.num_draft + 1
        chain_tok = torch.cat([ctx.roots[:, None], drafts], 1)
        if chain_tok.shape[1] < n1:
            chain_tok = torch.cat([chain_tok, chain_tok.new_zeros(b, n1 - chain_tok.shape[1])], 1)
        head = _padded(tree, n1)
        tokens = torch.where(take, chain_tok, head.tokens)
        parents = torch.where(take, self.chain_parents, head.parents)
        depth = torch.where(take, self.chain_depth, head.depth)
        valid = torch.where(take, self.chain_open, head.valid)
        rank = torch.where(take, self.chain_rank, head.ranks())
        return Tree(tokens, parents, depth, valid, max(tree.max_depth, self.chain), rank)


class LookupChain(NgramAssist):
    """The full tree's step where every row's suffix matched (`NgramAssist.lookup_only`): each row
    verifies the lookup's chain, as the full step would, and the head only takes in the last step's
    path (`keep_up`, as in a plain step) without drafting a tree that would be dropped. Its drafts,
    verify and commit are the full step's; its cost is the chain's verify and one head forward.
    A row without a match (none, where the engine gates right) verifies its root alone."""

    def propose(self, ctx: DraftContext) -> Tree:
        self.inner.keep_up(ctx)
        drafts, found = self.lookup.lookup(ctx, self.cols, self.min_ngram)
        tree = chain_tree(ctx.roots, drafts, found[:, None].expand_as(drafts))
        return _padded(tree, self.num_draft + 1)


def _padded(tree: Tree, size: int) -> Tree:
    """The tree in `size` nodes: padding nodes (under the root, never valid) after its own."""
    pad = size - tree.size
    if pad <= 0:
        return tree
    b, dev = tree.tokens.shape[0], tree.tokens.device
    zeros = torch.zeros(b, pad, dtype=torch.long, device=dev)
    rank = torch.cat([tree.ranks(), torch.arange(tree.size, size, device=dev).expand(b, pad)], 1)
    return Tree(torch.cat([tree.tokens, zeros], 1), torch.cat([tree.parents, zeros], 1),
                torch.cat([tree.depth, zeros + 1], 1),
                torch.cat([tree.valid, torch.zeros(b, pad, dtype=torch.bool, device=dev)], 1), tree.max_depth, rank)
