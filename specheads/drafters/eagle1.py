"""The EAGLE-1 drafter: the feature head drafts an EAGLE-2 dynamic tree (topk 1: a chain) on the
device, at fixed shapes and without host syncs (the engine captures draft, verify and commit as
one CUDA graph); the same code runs on CPU.

Row state, with L the row's committed length (its root, the last emitted token, is token L):
- the head's own KV cache of committed entries: entry p (rotary position p, cache slot p) read
  the embedding of token p+1 and the target's feature f_p (its final hidden state, after its
  norm). Entries 0..C-1 are in the cache, C = `committed`.
- pending entries: the last step's accepted path (`commit`: the target's feature at each path
  node and the target's token after it), or the prompt's last position (`prefill`). They sit at
  positions C.., and the next `propose` feeds them first (their keys land at their positions),
  after which C = L.

`propose` feeds the pending entries; the last one's output (the predicted f_L) gives the
depth-1 candidates through the target's lm_head. A depth-d node is the entry at position
L + d - 1: its token and its parent's output (the root's: that predicted f_L); its keys go to
the room after the context bucket (kv + (d-1)k + i), and it attends to the committed entries,
its ancestors and itself (mask rows that `topk_expand` builds from the parents', two buffers
read one, write the other). Each depth keeps the k best candidates by summed log-probability
as the next frontier, and the tree keeps the best `num_draft_tokens` of the pool
(`CandidatePool`, as the MTP and Medusa drafters).
"""

from __future__ import annotations

import torch

from specheads.drafters import DrafterError, DraftSetup
from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult, tier_copy
from specheads.drafters.common import CandidatePool, HeadCacheRows, check_head_setup
from specheads.kernels.draft import feed_inputs, topk_expand
from specheads.kernels.path import take_path
from specheads.modules import gqa_attention
from specheads.runtime.tree import Tree


class Eagle1Drafter(HeadCacheRows, Drafter):
    abilities = Abilities(on_device=True, trees=True, tiers=True)

    def __init__(self, head, embed, num_steps: int = 5, topk: int = 4, num_draft_tokens: int | None = 16,
                 lm_head_int8: bool = True):
        if num_steps < 1 or topk < 1:
            raise DrafterError(f"an EAGLE-1 head drafts num_steps >= 1 deep with topk >= 1 (got {num_steps}, {topk})")
        self.head, self.embed = head, embed
        self.lm_head_int8 = lm_head_int8
        cfg = head.config
        self.needs = Needs(capture_layers=tuple(cfg.target_layer_ids))
        self.depth = self.steps = num_steps
        self.topk = topk
        self.pool = CandidatePool(num_steps, topk, num_draft_tokens)
        self.num_draft = self.pool.num_draft
        self.width = self.depth + 1  # pending entries: an accepted path is at most depth + 1 long
        self.tree_room = (num_steps - 1) * topk  # the frontier nodes' entries after the context
        self.n_kv, self.head_dim = cfg.num_key_value_heads, cfg.head_dim

    @classmethod
    def from_setup(cls, setup: DraftSetup) -> "Eagle1Drafter":
        check_head_setup(setup)
        setup.head.attach_target(setup.target)
        return cls(setup.head, setup.target.embed_tokens, setup.num_steps, setup.topk, setup.num_draft_tokens,
                   **setup.options)

    def prepare(self, device) -> None:
        """On CUDA: the fused kernels, and (lm_head_int8, default True) an int8 copy of the
        target's lm_head for the draft logits (drafts only: the target verifies every token)."""
        self.head.fuse_for_inference(lm_head_int8=self.lm_head_int8)

    # ................................................................. state
    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        kv = 2 * rows * self.n_kv * (cap + self.tree_room) * self.head_dim * elem
        pending = rows * self.width * (self.head.config.target_hidden_size * elem + 8)
        return kv + pending + 2 * rows * self.topk * (cap + self.tree_room)

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        cfg = self.head.config
        self.k = torch.zeros(rows, self.n_kv, cap + self.tree_room, self.head_dim, device=device, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.committed = torch.zeros(rows, dtype=torch.long, device=device)  # entries in the cache
        self.pending_aux = torch.zeros(rows, self.width, cfg.target_hidden_size, device=device, dtype=dtype)
        self.pending_tok = torch.zeros(rows, self.width, dtype=torch.long, device=device)
        self.pending_n = torch.ones(rows, dtype=torch.long, device=device)
        # constants a step reads (made here: a captured step launches nothing to make them)
        self.cols = torch.arange(cap + self.tree_room, device=device)
        self.zero_rows = torch.zeros(rows, self.topk, dtype=torch.long, device=device)  # depth 1's parent: row 0
        self.target_ids = torch.arange(cfg.vocab_size, device=device)  # draft id == target id
        self.masks = torch.zeros(2, rows, self.topk, cap + self.tree_room, dtype=torch.bool, device=device)
        self.pool.allocate(rows, device)

    def tier(self, shape) -> "Eagle1Drafter":
        """A smaller tree over the same head cache and pending entries, with its own pool and masks."""
        tier = tier_copy(self, shape)
        rows, device = self.committed.shape[0], self.committed.device
        tier.pool = self.pool.tier(shape, rows, device)
        tier.tree_room = (shape.steps - 1) * shape.topk
        tier.masks = torch.zeros(2, rows, shape.topk, self.masks.shape[-1], dtype=torch.bool, device=device)
        return tier

    # ................................................................. the head over the cache
    def _run(self, tokens, features, positions, slots, mask, rows=None):
        """The head over entries [b, T] (token ids, features [b, T, H], or features' `rows` [b, T])
        at `positions`: their keys written at `slots` [b, T] of rows [:b]'s cache, attention over
        its first S columns under mask [b, 1, T, S]. Returns the predicted features [b, T, H]."""
        b = tokens.shape[0]
        return self.head.draft(tokens, self.embed.weight, features, positions, self.k[:b], self.v[:b], slots, mask,
                               rows)

    # ................................................................. the step
    def prefill(self, batch: PrefillBatch) -> None:
        """Rows start.. get a prompt each: entries 0..len-2 (features at p, the token after p) go
        into the cache now; entry len-1 (its token: the first generated one) pends for the first step."""
        start, feats, nxt, lens = batch.start, batch.features, batch.next_tokens(), batch.lens
        k_rows, w = nxt.shape
        rows = slice(start, start + k_rows)
        ar = torch.arange(w, device=nxt.device)
        # causal over the entries going into the cache, and each entry itself (no row attends to nothing)
        mask = ((ar[:, None] >= ar[None, :])[None] & (ar[None, None, :] < (lens - 1)[:, None, None])) | \
            (ar[:, None] == ar[None, :])[None]
        k_cache, v_cache = self.k[rows, :, :w], self.v[rows, :, :w]

        def attend(q, k, v):
            k_cache.copy_(k)
            v_cache.copy_(v)
            return gqa_attention(q, k, v, mask[:, None])

        self.head(self.embed(nxt), feats.to(self.k.dtype), ar.expand(k_rows, w), attend)
        self.committed[rows] = lens - 1
        last = (lens - 1)[:, None]
        self.pending_aux[rows] = 0
        self.pending_aux[rows, 0] = feats.gather(1, last[:, :, None].expand(-1, 1, feats.shape[-1]))[:, 0].to(
            self.pending_aux.dtype)
        self.pending_tok[rows] = 0
        self.pending_tok[rows, 0] = nxt.gather(1, last)[:, 0]
        self.pending_n[rows] = 1

    def commit(self, step: StepResult) -> None:
        """The next feed: the path's target features, and after each path node the target's token
        there (the next path node's, the bonus token after the last)."""
        b, cols = step.rows, step.path.shape[1]  # a smaller tier's path fills the first entries
        take_path(step.path, step.accepted, step.features, step.target_tokens, self.pending_aux[:b, :cols],
                  self.pending_tok[:b, :cols], self.pending_n[:b])

    def _feed(self, b: int, kv: int, masks=None, width: int | None = None):
        """Rows [:b]'s pending entries through the head (their K/V written at their positions, the
        committed length advanced): the head's output at every entry, each row's last entry and the
        draft depths' positions."""
        w = width or self.width  # (a narrower feed: the pending entries are at most w a row)
        positions, mask, last, depth_positions = feed_inputs(self.committed[:b], self.pending_n[:b], w, kv,
                                                             masks, self.steps)
        fed = self._run(self.pending_tok[:b, :w], self.pending_aux[:b, :w], positions, positions, mask[:, None])
        return fed, last, depth_positions

    def propose(self, ctx: DraftContext) -> Tree:
        b, kv, roots = ctx.rows, ctx.kv, ctx.roots
        head, k = self.head, self.topk
        dev = roots.device
        width = kv + self.tree_room
        # both mask buffers start as the context (column < the new committed length)
        both = self.masks[:, :b, :, :width] if self.steps > 1 else None
        fed, last, depth_positions = self._feed(b, kv, both, self.fed(ctx))
        hidden = fed.gather(1, last[:, None, None].expand(b, 1, fed.shape[-1]))  # the predicted f_L [b, 1, H]
        masks = [both[0], both[1]] if both is not None else [None, None]
        pool = pool_tok, pool_score, pool_parent = self.pool.buffers(b, dev)
        front_tok, front_score, parent, front_pool = topk_expand(
            head.logits(hidden), self.pool.zero_score[:b], self.pool.no_parent[:b], k, self.target_ids,
            pool_tok[:, :k], pool_score[:, :k], pool_parent[:, :k], 0, masks[0], masks[0], kv, 0)[:4]
        features, rows = hidden, self.zero_rows[:b, :k]  # depth 1: every node's parent is the root
        slots = self.cols[kv: width][None]
        off = k
        for d in range(1, self.steps):
            mask_d = masks[(d - 1) % 2]
            out = self._run(front_tok, features, depth_positions[:, d - 1: d].expand(b, k),
                            slots[:, (d - 1) * k: d * k].expand(b, k), mask_d[:, None, :, : kv + d * k], rows)
            n = k * k
            front_tok, front_score, parent, front_pool = topk_expand(
                head.logits(out), front_score, front_pool, k, self.target_ids, pool_tok[:, off: off + n],
                pool_score[:, off: off + n], pool_parent[:, off: off + n], off, mask_d,
                masks[d % 2] if d + 1 < self.steps else None, kv, d * k)[:4]
            features, rows = out, parent  # the next depth reads its parents' rows in place
            off += n
        return self.pool.tree(roots, pool)
