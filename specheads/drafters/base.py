"""The drafter interface: what the engine asks of every drafter, and nothing else.

A drafter proposes a tree of draft tokens under each row's root (the last emitted token);
the engine verifies it on the target, accepts the target's own path and commits it. The
engine knows drafters only through this module: what a drafter needs from the target and
what it can do are declared (`Needs`, `Abilities`), never probed.

Life of a drafter inside an engine (rows are cache rows; active rows are packed at the front):

    accept_depth(depth)                  (a drafter another one's drafts are verified beside,
                                         drafters/assist.py) before allocate: commit takes
                                         paths that deep
    allocate(rows, cap, device, dtype)   once, before the first request: per-row state
    prefill(PrefillBatch)                a group of prompts joined rows start..start+k
    propose(DraftContext) -> Tree        a step's tree for rows [:b]
    commit(StepResult)                   the accepted paths of that step, with the target's
                                         outputs at every node
    keep_up(DraftContext, wide)          (device drafters) a plain step, where the engine verifies
                                         the roots alone: the state brought up to date before it;
                                         `commit` then takes the root's one-node path
    first_draft(DraftContext)            (abilities.first_draft) in a small batch's plain step, after
                                         keep_up: each row's first draft, which the engine checks
                                         against the target's token so that the speculation policy
                                         sees acceptance while it drafts nothing
    move_row / clear_row / park_rows     rows leave (the last row moves into the freed one),
                                         padding rows return to an idle state
    state()                              the small per-row tensors a step changes: the engine
                                         snapshots and restores them around CUDA-graph warm-up
    tier(TreeShape) -> Drafter           (abilities.tiers) after allocate: a drafter of a smaller
                                         tree over the same weights and per-row state, for the
                                         speculation policy's tiers (runtime.policy)

A device drafter (`abilities.on_device`) proposes and commits inside the step, at fixed
shapes and without host syncs, so the engine captures draft + verify + commit as one CUDA
graph and can launch the next step before reading the current one. A host drafter proposes
on the host from each row's token history before the step (`needs.history`); the engine
copies its tree into the step's inputs.

To add a drafter: subclass `Drafter`, set `needs`, `abilities`, `depth` and `num_draft`,
implement `propose` (and whatever state hooks it uses), and register a builder under a
method name with `specheads.drafters.register_method`; `SpecEngine(target, method=NAME)`,
`specheads generate --method NAME` and the evaluation then use it.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from specheads.runtime.policy import TreeShape
from specheads.runtime.tree import Tree


@dataclass(frozen=True)
class Needs:
    """What a drafter reads from the target and the engine."""

    # outputs of these 0-based target decoder layers, concatenated (features [.., n * H]):
    # at every prompt position in `prefill` and every verified node in `commit`
    capture_layers: tuple[int, ...] = ()
    # each row's token history (prompt + emitted tokens) as a host list, in `propose`
    history: bool = False


@dataclass(frozen=True)
class Abilities:
    """What a drafter can do."""

    # proposes on the device inside the step (capturable in a CUDA graph); False: on the host
    on_device: bool = False
    # proposes branching trees; False: a chain (a path) under each root
    trees: bool = False
    # drafts smaller trees over the same per-row state (`tier`), so a policy can pick a tree per step
    tiers: bool = False
    # tells its first draft in a plain step (`first_draft`), cheaply enough to run in every plain step
    # of a small batch
    first_draft: bool = False


@dataclass
class PrefillBatch:
    """Prompts that joined rows start..start+k, after the target's prompt forward."""

    start: int
    ids: torch.Tensor  # [k, W] prompt tokens, right-padded
    lens: torch.Tensor  # [k] prompt lengths (on the device)
    first: torch.Tensor  # [k] the first generated token of each prompt
    features: torch.Tensor | None  # [k, W, n * H] the captured layers' outputs (needs.capture_layers)
    hidden: torch.Tensor  # [k, W, H] the target's final (normed) hidden state

    def next_tokens(self) -> torch.Tensor:
        """[k, W]: the token after each prompt position (the first generated token after the last)."""
        nxt = torch.cat([self.ids[:, 1:], torch.zeros_like(self.ids[:, :1])], 1)
        return nxt.scatter(1, (self.lens - 1)[:, None], self.first[:, None])


@dataclass
class DraftContext:
    """One step's drafting job: rows [:rows] with these roots."""

    rows: int  # b: the rows stepped (a batch bucket; rows past the active ones are padding)
    kv: int  # the step's context bucket: cache slots [:kv] may be read
    roots: torch.Tensor  # [b] each row's last emitted token
    histories: list[list[int]] | None = None  # per active row, when needs.history
    # the most entries a row can hold pending from the steps before (a path's nodes), where the
    # engine knows fewer than the drafter allows for (`accept_depth`): a drafter that feeds its
    # pending entries at a fixed width (HeadCacheRows) feeds this many; 0: its own width
    feed: int = 0


@dataclass
class StepResult:
    """A verified step: the tree, the accepted path and the target's outputs at every node."""

    rows: int
    tree: Tree
    path: torch.Tensor  # [b, depth + 1] node indices of the accepted path, -1 after its end
    accepted: torch.Tensor  # [b] path length (the root counts)
    target_tokens: torch.Tensor  # [b, N] the target's own token at every node (the next one after it)
    features: torch.Tensor | None  # [b, N, n * H] captured layers at every node
    hidden: torch.Tensor  # [b, N, H] the target's final hidden state at every node


class Drafter:
    """Base class of drafters. Defaults: no per-row state, nothing to do at prefill or commit."""

    needs: Needs = Needs()
    abilities: Abilities = Abilities()
    depth: int = 0  # the deepest node a proposed tree may hold (its root at depth 0)
    num_draft: int = 0  # draft nodes per tree (the verify's fixed shape is 1 + num_draft)
    topk: int = 1  # a dynamic tree's branching (1: a chain)

    # ................................................................ state
    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        """Bytes `allocate(rows, cap, ...)` takes (the engine's memory plan counts them)."""
        return 0

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        """Per-row state for `rows` cache rows of `cap` slots."""

    def state(self) -> list[torch.Tensor]:
        """The small per-row tensors a step changes (restored after graph warm-up)."""
        return []

    def move_row(self, src: int, dst: int, length: int) -> None:
        """Row src's state (its first `length` positions) into row dst."""

    def clear_row(self, row: int) -> None:
        """A row left: back to an idle state that computes harmlessly inside a padded batch."""

    def park_rows(self, start: int, stop: int) -> None:
        """Padding rows [start:stop] stepped with the batch; put them back at an empty context."""

    def prepare(self, device) -> None:
        """Called once on a CUDA engine before allocation (e.g. fuse weights for inference)."""

    def accept_depth(self, depth: int) -> None:
        """Before `allocate`: `commit` will take accepted paths up to `depth` deep, deeper than this
        drafter's own trees (another drafter drafted them: drafters/assist.py). Default: refused
        past its own depth."""
        if depth > self.depth:
            raise NotImplementedError(f"{type(self).__name__} commits paths of at most {self.depth} drafts, "
                                      f"not {depth}")

    def full_drafts(self):
        """A context in which every step drafts its whole shape, whatever the drafter would stop early
        for (the engine times its steps' costs inside it). Default: nothing to turn off."""
        return contextlib.nullcontext()

    def tier(self, shape: TreeShape) -> "Drafter":
        """(abilities.tiers) A drafter of a tree of `shape` (at most this one's depth, topk and
        num_draft), called after `allocate`: it shares this drafter's weights and per-row state
        (the engine calls the row hooks on this drafter only) and keeps its own step scratch, so
        the engine can verify a smaller tree at a step and the full one at the next."""
        raise NotImplementedError(f"{type(self).__name__} drafts one tree shape only")

    # ................................................................ the step
    def prefill(self, batch: PrefillBatch) -> None:
        """Prompts joined; device drafters must stay capturable here (no host syncs)."""

    def propose(self, ctx: DraftContext) -> Tree:
        """A tree of 1 + num_draft nodes per row, at most `depth` deep (node 0 the root)."""
        raise NotImplementedError

    def commit(self, step: StepResult) -> None:
        """The step's accepted paths (device work; inside the captured step for device drafters)."""

    def keep_up(self, ctx: DraftContext, wide: bool = True) -> None:
        """(device drafters) A plain step verifies every row's root alone; before its verify, take
        in what the last step left pending, as `propose` would (the engine then commits the root's
        one-node path), so that a drafting step after plain ones drafts from the whole context.
        `wide`: the last step drafted (its accepted path pends); False: a plain step or a prefill
        came last, so each row has one entry pending. Default: propose and drop the tree (the
        engine calls it on its smallest tier); a drafter whose `propose` does more than that
        overrides it."""
        self.propose(ctx)

    def first_draft(self, ctx: DraftContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(abilities.first_draft; device work, after `keep_up`, before the step's commit) Each row's
        first draft under its root, the token `propose` would draft at depth 1 of a chain, and
        whether it has one: (tokens [b], found [b] bool)."""
        raise NotImplementedError


def tier_copy(drafter, shape):
    """A shallow copy of a drafter (the same weights and per-row state tensors) drafting a tree of
    `shape` (a runtime.policy.TreeShape); the caller gives it its own step scratch."""
    tier = copy.copy(drafter)
    tier.steps = tier.depth = shape.steps
    tier.topk = shape.topk
    tier.num_draft = shape.num_draft
    return tier
