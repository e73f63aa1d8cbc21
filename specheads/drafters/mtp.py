"""The MTP drafter: D sequential modules draft a chain (topk 1) or an EAGLE-2-style tree.

Row state, with L the row's committed length (its root, the last emitted token, sits at
position L and is not in any cache yet):
- each module's KV cache. Module d's entry at position p needs token p+1+d, so it is known
  once p+1+d <= L: module d's cache lags d positions behind the target's.
- rings of the last positions' target features (positions L-W..L-1) and tokens (up to L).

A step's `propose` runs each module once. Module d recomputes every entry in the window of the
last W positions whose inputs are known (entries known before are recomputed to the same
values; those that became known this step are new): W covers what a step can accept plus the
lag. Module 0's output at position L-1 (its input token is the root) gives the depth-1 drafts;
in the same call as its window, module d >= 1 runs at position L-1 on each frontier node (its
token and its parent's output) and gives depth d+1. Every drafted node attends to its module's
cache (the window's entries just written included) and to itself.
`commit` writes the accepted path's target features and tokens into the rings.
All of it at fixed shapes without host syncs: the engine captures draft and verify as one
CUDA graph.
"""

from __future__ import annotations

import torch

from specheads.drafters import DraftSetup
from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult, tier_copy
from specheads.drafters.common import CandidatePool, check_head_setup
from specheads.kernels.draft import topk_expand
from specheads.kernels.mtp_window import mtp_window
from specheads.kernels.path import take_path
from specheads.runtime.tree import Tree


class MTPDrafter(Drafter):
    abilities = Abilities(on_device=True, trees=True, tiers=True)

    def __init__(self, head, embed, num_steps: int = 3, topk: int = 1, num_draft_tokens: int | None = None,
                 lm_head_int8: bool = True):
        self.head, self.embed = head, embed
        self.lm_head_int8 = lm_head_int8
        cfg = head.config
        self.modules = cfg.num_modules
        self.depth = self.steps = min(num_steps, self.modules)
        self.topk = topk
        self.pool = CandidatePool(self.steps, topk, num_draft_tokens)
        self.num_draft = self.pool.num_draft
        self.needs = Needs(capture_layers=tuple(cfg.target_layer_ids))
        self.window = 2 * self.modules + 2  # a step accepts at most depth + 1 tokens; module d lags d
        self.ring = self.window + 2
        self.n_kv, self.head_dim = cfg.num_key_value_heads, cfg.head_dim

    @classmethod
    def from_setup(cls, setup: DraftSetup) -> "MTPDrafter":
        check_head_setup(setup)
        return cls(setup.head, setup.target.embed_tokens, setup.num_steps, setup.topk, setup.num_draft_tokens,
                   **setup.options)

    def prepare(self, device) -> None:
        """On CUDA: the fused kernels, and (lm_head_int8, default True) the draft lm_head in int8."""
        self.head.fuse_for_inference(lm_head_int8=self.lm_head_int8)

    # ................................................................. state
    def _room(self) -> int:
        return self.topk + 1  # a depth's frontier nodes, then one slot for entries not known yet

    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        feat = self.head.config.target_hidden_size
        kv = 2 * self.modules * rows * self.n_kv * (cap + self._room()) * self.head_dim * elem
        return kv + rows * (self.ring + 1) * (feat * elem + 8)

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        shape = (self.modules, rows, self.n_kv, cap + self._room(), self.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.length = torch.zeros(rows, dtype=torch.long, device=device)
        feat = self.head.config.target_hidden_size
        self.feats = torch.zeros(rows, self.ring + 1, feat, device=device, dtype=dtype)  # last index: discard
        self.tokens = torch.zeros(rows, self.ring + 1, dtype=torch.long, device=device)
        self.pool.allocate(rows, device)

    def tier(self, shape) -> "MTPDrafter":
        """Fewer modules deep or a narrower tree over the same caches and rings (its own pool)."""
        tier = tier_copy(self, shape)
        tier.pool = self.pool.tier(shape, self.length.shape[0], self.length.device)
        return tier

    def state(self) -> list[torch.Tensor]:
        return [self.length, self.feats, self.tokens]

    def move_row(self, src: int, dst: int, length: int) -> None:
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
        for t in self.state():
            t[dst] = t[src]

    def clear_row(self, row: int) -> None:
        self.length[row] = 0
        self.feats[row] = 0
        self.tokens[row] = 0

    def park_rows(self, start: int, stop: int) -> None:
        self.length[start:stop] = 0

    # ................................................................. helpers
    def _run(self, d, tokens, hidden, positions, k_cache, v_cache, slots, mask, rows=None):
        """Module d over queries [b, T] at `positions` (inputs: hidden [b, T, H], or hidden's `rows`
        [b, T]): their keys written at `slots` of the module's cache (first b rows), attention over
        the cache's columns under mask [b, 1, T, S]."""
        return self.head.draft(d, tokens, self.embed.weight, hidden, positions, k_cache, v_cache, slots, mask, rows)

    def _ring_write(self, rows: slice, positions, valid, feats, tokens_next) -> None:
        """Features at `positions` [k, n] and the token after each, into the rows' rings
        (entries where `valid` is False go to the discard slot)."""
        discard = torch.full_like(positions, self.ring)
        at = torch.where(valid, positions % self.ring, discard)
        nxt = torch.where(valid, (positions + 1) % self.ring, discard)
        self.feats[rows].scatter_(1, at[:, :, None].expand(-1, -1, feats.shape[-1]), feats.to(self.feats.dtype))
        self.tokens[rows].scatter_(1, nxt, tokens_next)

    # ................................................................. the step
    def prefill(self, batch: PrefillBatch) -> None:
        """Every module's entries over the prompts (those whose input token is known), the
        rings' last positions."""
        start, lens, feats = batch.start, batch.lens, batch.features
        nxt = batch.next_tokens()
        k_rows, w = nxt.shape
        rows = slice(start, start + k_rows)
        dev = nxt.device
        pos = torch.arange(w, device=dev).expand(k_rows, w)
        hidden = feats.to(self.k.dtype)
        causal = pos[:, :, None] >= pos[:, None, :]
        for d in range(self.modules):
            tok = torch.cat([nxt[:, d:], torch.zeros_like(nxt[:, :d])], 1)  # token p+1+d
            known = pos + 1 + d <= lens[:, None]
            # known earlier entries, and each query's own slot (a row never attends to nothing)
            mask = ((causal & known[:, None, :]) | (pos[:, :, None] == pos[:, None, :]))[:, None]
            hidden = self._run(d, tok, hidden, pos, self.k[d, rows], self.v[d, rows], pos, mask)
        self.length[rows] = lens
        # the rings: the last `ring` positions of each prompt
        last = lens[:, None] - self.ring + torch.arange(self.ring, device=dev)
        valid = last >= 0
        src = last.clamp(min=0)
        self._ring_write(rows, last, valid, feats.gather(1, src[:, :, None].expand(-1, -1, feats.shape[-1])),
                         nxt.gather(1, src))

    def commit(self, step: StepResult) -> None:
        """The accepted path's target features and the token after each into the rings, past the
        committed length; the length advanced (one launch)."""
        b = step.rows
        take_path(step.path, step.accepted, step.features, step.target_tokens, self.feats[:b], self.tokens[:b],
                  self.length[:b], ring=self.ring)

    def _window(self, b: int, kv: int, k: int):
        """The step's inputs for every module at once (kernels/mtp_window.py, one launch): tokens
        and hidden rows [D, b, W + k] (the frontier's last k filled in by the expansions), positions
        [b, W + k] (the frontier's at L-1), cache slots [D, b, W + k] and masks [D, b, 1, W + k, S]."""
        return mtp_window(self.length[:b], self.tokens[:b], self.window, self.ring, self.modules, kv,
                          kv + self._room(), k)

    def _window_run(self, d: int, hidden, inputs, b: int):
        """Module d over the window alone (`inputs`: `_window`'s result; hidden: its input rows)."""
        tokens, rows, positions, slots, mask = inputs
        w = self.window
        return self._run(d, tokens[d, :, :w], hidden, positions[:, :w], self.k[d, :b], self.v[d, :b], slots[d, :, :w],
                         mask[d, :, :, :w], rows=rows[d, :, :w])

    def keep_up(self, ctx: DraftContext, wide: bool = True) -> None:
        """A plain step: every module's window (its cache catching up with the committed tokens),
        without the drafts' logits and frontiers."""
        inputs = self._window(ctx.rows, ctx.kv, self.topk)
        out = self.feats[: ctx.rows]
        for d in range(self.modules):
            out = self._window_run(d, out, inputs, ctx.rows)

    def propose(self, ctx: DraftContext) -> Tree:
        """Module by module, one call each: the window's entries (module d's cache catching up
        with the committed tokens) and, from module 1 on, the frontier at L-1 (depth d + 1 drafts,
        top-k of each node); module 0's output at L-1 gives the depth-1 drafts. Each expansion
        writes the next module's frontier tokens and parent rows into its inputs in place."""
        b, kv, roots = ctx.rows, ctx.kv, ctx.roots
        head, k, w = self.head, self.topk, self.window
        dev = roots.device
        inputs = tokens, rows, positions, slots, mask = self._window(b, kv, k)
        target_ids = head.target_ids()
        pool = pool_tok, pool_score, pool_parent = self.pool.buffers(b, dev)

        def expand(d, logits, front_score, front_pool, off, n):
            """Depth d + 1's drafts from module d's logits; the new frontier into module d + 1's
            inputs (its parents: rows of module d's output, the frontier's after the window)."""
            dst = {}
            if d + 1 < self.modules:
                dst = dict(tok_out=tokens[d + 1, :, w:], parent_out=rows[d + 1, :, w:],
                           parent_base=w - 1 if d == 0 else w)
            return topk_expand(logits, front_score, front_pool, k, target_ids, pool_tok[:, off: off + n],
                               pool_score[:, off: off + n], pool_parent[:, off: off + n], off, None, None, kv, 0,
                               **dst)[1:4:2]

        out = self._window_run(0, self.feats[:b], inputs, b)
        front_score, front_pool = expand(0, head.logits(out[:, w - 1:]), self.pool.zero_score[:b],
                                         self.pool.no_parent[:b], 0, k)
        off = k
        for d in range(1, self.modules):
            if d < self.steps:  # the window, then the frontier (its inputs: its parents' outputs)
                out = self._run(d, tokens[d], out, positions, self.k[d, :b], self.v[d, :b], slots[d], mask[d],
                                rows=rows[d])
                front_score, front_pool = expand(d, head.logits(out[:, w:]), front_score, front_pool, off, k * k)
                off += k * k
            else:  # deeper than this tree: the window only (another tier drafts from it)
                out = self._window_run(d, out, inputs, b)
        return self.pool.tree(roots, pool)
