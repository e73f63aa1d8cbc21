"""The EAGLE-3 drafter: the head drafts a dynamic (EAGLE-2) or static tree on the device."""

from __future__ import annotations

import contextlib
import math

import torch

from specheads.drafters import DrafterError, DraftSetup
from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult, tier_copy
from specheads.drafters.common import HeadCacheRows, check_head_setup
from specheads.kernels.draft import feed_inputs, select_tree, topk_expand
from specheads.kernels.fused import embedding, skip_stopped, use_triton
from specheads.kernels.path import take_path
from specheads.runtime.defaults import tree_pool
from specheads.runtime.tree import Tree, parse_static_tree


# The draft stop's threshold where draft_stop is not given, under the adaptive policy (off under the
# fixed one): the best of 0.02 and 0.05 on the evaluation suite's validation answers for chat and coding
# alike, replayed under the n-gram assist's gate (gpu_runs/draft_stop.py; gpu_runs/README.md, "A lever
# for batch 1")
DRAFT_STOP = 0.05
# the widest batch whose steps may stop where draft_stop_rows is not given: the stop needs every row's
# draft to fall low at once, which a wider batch rarely has, and its checks then only cost (on an H100,
# 2026-12-06, adaptive with the stop at every batch size against without it, median of 3: batch 1 +2.9%
# chat, +3.7% coding; batch 8 -0.3% / -0.8%; chat batch 32 +2.6% (another mix of tiers), 64 -3.3%)
DRAFT_STOP_ROWS = 1


def default_stop(policy: str | None) -> float:
    """draft_stop where it is not given: DRAFT_STOP under the adaptive policy, else 0 (off)."""
    return DRAFT_STOP if policy == "adaptive" else 0.0


def stop_threshold(value) -> float:
    """draft_stop as given (a number or its text) -> a probability in [0, 1), 0 for off."""
    if value is None:
        return 0.0
    try:
        p = float(value)
    except (TypeError, ValueError):
        p = -1.0
    if not 0.0 <= p < 1.0 or isinstance(value, bool):
        raise ValueError(f"draft_stop must be a probability in [0, 1) (0: off), e.g. draft_stop=0.05; got {value!r}")
    return p


class Eagle3Drafter(HeadCacheRows, Drafter):
    """The EAGLE-3 head, drafting on the device at fixed shapes: the engine captures the draft
    and the verify of one step in a single CUDA graph.

    Per cache row it keeps the head's own KV cache of committed entries (entry p: the target's
    captured features at position p and the token at p + 1), one buffer a decoder layer
    ([layers, rows, kv heads, slots, d]), and the pending entries of the last step (the accepted
    path, taken in `commit`), fed at the start of the next step.

    Options: lm_head_int8 (default True) drafts with an int8 copy of the head's lm_head on
    CUDA: it changes which tokens are drafted, never the output (the target verifies).
    draft_stop P (a probability; 0 = off): a dynamic tree's draft stops after the first depth where
    no row's best node has a cumulative probability of at least P, decided on the device inside the
    step: the deeper depths' kernels return at once (kernels/fused.py, `skip_stopped`) and the tree
    takes the nodes drafted (the rest of its nodes padding, never valid). It changes which tokens
    are drafted, never the output. Unset: DRAFT_STOP under the adaptive policy (its depth chosen
    each step by the draft itself), off under the fixed one (every step drafts its shape whole).
    draft_stop_rows N (default DRAFT_STOP_ROWS, 1): the stop applies to steps of batches of at most N
    rows (every row's draft must fall low for a depth to go undrafted); wider batches draft whole."""

    abilities = Abilities(on_device=True, trees=True, tiers=True)

    def __init__(self, head, embed, num_steps: int = 5, topk: int = 4, num_draft_tokens: int = 16,
                 static_tree=None, lm_head_int8: bool = True, draft_stop=None, draft_stop_rows=DRAFT_STOP_ROWS):
        self.head, self.embed = head, embed
        self.lm_head_int8 = lm_head_int8
        self.draft_stop = stop_threshold(draft_stop)
        if isinstance(draft_stop_rows, bool) or not isinstance(draft_stop_rows, int) or draft_stop_rows < 1:
            raise ValueError(f"draft_stop_rows must be a whole number of rows >= 1, e.g. draft_stop_rows=1; "
                             f"got {draft_stop_rows!r}")
        self.draft_stop_rows = draft_stop_rows
        self.needs = Needs(capture_layers=tuple(head.config.target_layer_ids))
        self.steps = num_steps
        self.topk = topk
        self.static = parse_static_tree(static_tree) if static_tree else None
        if self.static:
            self.steps = max(len(p) for p in self.static)
            self.num_draft = len(self.static)
            self.abilities = Abilities(on_device=True, trees=True, tiers=False)  # one fixed shape
        else:
            self.num_draft = min(num_draft_tokens, tree_pool(num_steps, topk))
            if topk == 1:
                self.num_draft = num_steps
        cfg = head.config
        self.n_kv, self.head_dim = cfg.num_key_value_heads, cfg.head_dim
        self.n_layers = cfg.num_layers
        self.depth = self.steps
        self.width = self.depth + 1  # pending entries: an accepted path is at most depth + 1 long

    @classmethod
    def from_setup(cls, setup: DraftSetup) -> "Eagle3Drafter":
        check_head_setup(setup, options=("lm_head_int8", "draft_stop", "draft_stop_rows"), static_trees=True)
        options = dict(setup.options)
        try:
            options["draft_stop"] = (default_stop(setup.policy) if options.get("draft_stop") is None
                                     else stop_threshold(options["draft_stop"]))
            return cls(setup.head, setup.target.embed_tokens, setup.num_steps, setup.topk, setup.num_draft_tokens,
                       setup.static_tree, **options)
        except ValueError as e:
            raise DrafterError(str(e)) from None

    def prepare(self, device) -> None:
        self.head.fuse_for_inference(lm_head_int8=self.lm_head_int8)

    # ................................................................. state
    def memory_bytes(self, rows: int, cap: int, elem: int) -> int:
        """What `allocate` takes for these rows (its KV cache and pending features dominate)."""
        room = (self.steps - 1) * self.topk if not self.static else len(self.static)
        kv = 2 * self.n_layers * rows * self.n_kv * (cap + room) * self.head_dim * elem
        pending = rows * self.width * 3 * self.head.config.target_hidden_size * elem
        return kv + pending + 2 * rows * self.topk * (cap + room)

    def allocate(self, rows: int, cap: int, device, dtype) -> None:
        cfg = self.head.config
        # room after any context bucket (<= cap) for the draft tree's own entries: each depth
        # writes its keys there and attends over [:bucket + entries so far], with no copy
        self.tree_room = (self.steps - 1) * self.topk if not self.static else len(self.static)
        self.k = torch.zeros(self.n_layers, rows, self.n_kv, cap + self.tree_room, self.head_dim, device=device,
                             dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.committed = torch.zeros(rows, dtype=torch.long, device=device)  # entries in the cache
        self.pending_aux = torch.zeros(rows, self.width, 3 * cfg.target_hidden_size, device=device, dtype=dtype)
        self.pending_tok = torch.zeros(rows, self.width, dtype=torch.long, device=device)
        self.pending_n = torch.ones(rows, dtype=torch.long, device=device)
        # constants a step reads (made here, so a captured step does not launch a kernel for each)
        self.cols = torch.arange(cap + self.tree_room, device=device)  # cache columns; also 0, 1, 2, ...
        # the draft stop's log-threshold, on the device (every tier reads this one; `full_drafts`)
        self.stop_log = torch.full((1,), math.log(self.draft_stop) if self.draft_stop else -math.inf,
                                   dtype=torch.float32, device=device)
        if self.static:
            self._static_plan = _StaticPlan(self.static, device)
        else:
            self._allocate_scratch(rows, device)

    def _allocate_scratch(self, rows: int, device) -> None:
        """What one tree size's step reads besides the row state (each tier has its own)."""
        k = self.topk
        # the candidate pool: the root's k children, then k * k children per deeper depth
        self.pool_depth = torch.tensor([1] * k + [d for d in range(2, self.steps + 1) for _ in range(k * k)],
                                       device=device)
        self.zero_score = torch.zeros(rows, 1, dtype=torch.float32, device=device)
        self.no_parent = torch.full((rows, 1), -1, dtype=torch.long, device=device)
        self.root_rows = torch.zeros(rows, k, dtype=torch.long, device=device)  # depth 1 reads the root's hidden
        self.all_valid = torch.ones(rows, self.num_draft + 1, dtype=torch.bool, device=device)
        # the draft stopped on the device (option draft_stop): [stopped, depth drafted, rows' counter]
        self.stop_state = torch.zeros(3, dtype=torch.int32, device=device)
        # the tree-attention mask rows of the frontier, two buffers (read one, write the other)
        self.masks = torch.zeros(2, rows, k, self.cols.numel(), dtype=torch.bool, device=device)

    def tier(self, shape) -> "Eagle3Drafter":
        """A smaller dynamic tree over the same head cache and pending entries (its own scratch);
        its frontier's entries use the first (steps - 1) * topk slots of the room after the context."""
        tier = tier_copy(self, shape)
        tier.tree_room = (shape.steps - 1) * shape.topk
        tier._allocate_scratch(self.committed.shape[0], self.committed.device)
        return tier

    @contextlib.contextmanager
    def full_drafts(self):
        """No draft stops while open (the engine times its steps' costs at their whole depth)."""
        if not self.draft_stop or not hasattr(self, "stop_log"):
            yield
            return
        self.stop_log.fill_(-math.inf)
        try:
            yield
        finally:
            self.stop_log.fill_(math.log(self.draft_stop))

    def move_row(self, src: int, dst: int, length: int) -> None:
        self.k[:, dst, :, :length] = self.k[:, src, :, :length]
        self.v[:, dst, :, :length] = self.v[:, src, :, :length]
        for t in self.state():
            t[dst] = t[src]

    def prefill(self, batch: PrefillBatch) -> None:
        """Rows start.. get a prompt each: captured features [k, W, 3H] and the token after each
        position [k, W] (the first generated token after the last), lengths lens [k] (on the
        device: no host sync, capturable). Entries 0..len-2 go into the cache now; entry
        len-1 pends for the first step."""
        start, aux, next_tokens, lens = batch.start, batch.features, batch.next_tokens(), batch.lens
        head, dtype = self.head, self.k.dtype
        k_rows, w = next_tokens.shape
        dev = next_tokens.device
        ar = torch.arange(w, device=dev)
        mask = (ar[:, None] >= ar[None, :])[None] & (ar[None, None, :] < (lens - 1)[:, None, None])
        _, k, v = head.step(embedding(next_tokens, self.embed.weight).to(dtype), head.project(aux.to(dtype)),
                            ar.expand(k_rows, w),
                            attn_mask=mask[:, None])
        rows = slice(start, start + k_rows)
        self.k[:, rows, :, :w] = k.view(self.n_layers, k_rows, self.n_kv, w, self.head_dim)
        self.v[:, rows, :, :w] = v.view(self.n_layers, k_rows, self.n_kv, w, self.head_dim)
        self.committed[rows] = lens - 1
        last = (lens - 1)[:, None]
        self.pending_aux[rows] = 0
        self.pending_aux[rows, 0] = aux.gather(1, last[:, :, None].expand(-1, 1, aux.shape[-1]))[:, 0].to(dtype)
        self.pending_tok[rows] = 0
        self.pending_tok[rows, 0] = next_tokens.gather(1, last)[:, 0]
        self.pending_n[rows] = 1

    # ................................................................. drafting
    def _feed(self, b: int, kv: int, masks=None, width: int | None = None):
        """Run rows [:b]'s pending entries through the head, their K/V written in place at
        their positions; returns the head's output at every entry [b, width, H], each row's last
        entry [b] (its output predicts the root's children) and the draft depths' positions
        (`feed_inputs`, which also sets `masks` to the context). Padding entries (past a row's
        count) are written beyond its committed length, where the next step's entries overwrite
        them before anyone looks."""
        head = self.head
        # causal by position: the committed entries and this feed's own earlier entries
        w = width or self.width  # (a narrower feed: the pending entries are at most w a row)
        positions, mask, last, depth_positions = feed_inputs(self.committed[:b], self.pending_n[:b], w, kv,
                                                             masks, self.steps)
        out = head.draft_step(self.pending_tok[:b, :w], self.embed.weight, head.project(self.pending_aux[:b, :w]),
                              None, positions, self.k[:, :b], self.v[:, :b], positions, mask[:, None])
        return out, last, depth_positions

    @staticmethod
    def _last(out: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        b = out.shape[0]
        return out.gather(1, last[:, None, None].expand(b, 1, out.shape[-1]))

    def commit(self, step: StepResult) -> None:
        """The next feed: the path's features, and after each path node the target's choice there
        (the next node's token along the path, the bonus after its last)."""
        b, cols = step.rows, step.path.shape[1]  # a smaller tier's path fills the first entries
        take_path(step.path, step.accepted, step.features, step.target_tokens, self.pending_aux[:b, :cols],
                  self.pending_tok[:b, :cols], self.pending_n[:b])

    def propose(self, ctx: DraftContext) -> Tree:
        """Rows [:b]: feed the pending entries, then expand the tree under each root.

        Depth d's K frontier nodes write their keys at [kv + (d-1)K, kv + dK) of the head's
        buffer (room after the context) and attend to [:kv + dK] under mask rows that
        `topk_expand` builds from their parents' rows (two buffers, read one, write the other)."""
        b, kv, roots = ctx.rows, ctx.kv, ctx.roots
        head, k = self.head, self.topk
        width = kv + self.tree_room
        # both mask buffers start as the context: column < the row's committed length
        both = self.masks[:, :b, :, :width] if self.steps > 1 and not self.static else None
        fed, last, positions = self._feed(b, kv, both, self.fed(ctx))
        dev = roots.device
        base = self.committed[:b]  # == the target's committed length
        if self.static:
            return self._static(self._last(fed, last), base, kv, roots)
        masks = [both[0], both[1]] if both is not None else [None, None]
        n_pool = self.pool_depth.numel()
        pool_tok = torch.empty(b, n_pool, dtype=torch.long, device=dev)
        pool_score = torch.empty(b, n_pool, dtype=torch.float32, device=dev)
        pool_parent = torch.empty(b, n_pool, dtype=torch.long, device=dev)
        target_ids = head.target_ids()
        emb = self.embed.weight
        # each expansion also makes the next depth's layer input (fused heads), so a depth
        # starts at its projection
        if head.fused:  # the expansion reads each row's last fed entry in place (logits of all of them:
            # the lm_head streams its weight once however few the rows)
            hidden, logits, node_rows = fed, head.logits(fed), last
        else:
            hidden = self._last(fed, last)
            logits, node_rows = head.logits(hidden), None
        nxt = head.input_spec(emb, hidden) if self.steps > 1 else None
        # the draft stopped on the device (draft_stop): only where every depth's kernels are ours, so
        # that a depth not drafted launches nothing that reads what it did not write
        state = self.stop_state if (self.draft_stop and self.steps > 1 and b <= self.draft_stop_rows
                                    and (head.fused or not use_triton(roots))) else None
        front_tok, front_score, rows, front_pool, *inputs = topk_expand(
            logits, self.zero_score[:b], self.no_parent[:b], k, target_ids, pool_tok[:, :k], pool_score[:, :k],
            pool_parent[:, :k], 0, masks[0], masks[0], kv, 0, next_input=nxt, node_rows=node_rows,
            stop=(state, self.stop_log, 1) if state is not None else None)
        rows = self.root_rows[:b]  # depth 1 reads the root's hidden (non-fused heads: `hidden` is that row)
        # depth d's position: the root's (base - 1) + d, for d = 1 .. steps - 1 (feed_inputs made them)
        slots = self.cols[kv: width][None]  # the tree's own entries after the context
        off = k
        for d in range(1, self.steps):
            mask = masks[(d - 1) % 2]
            with skip_stopped(state):  # (a depth after the stop: each kernel returns at once)
                out = head.draft_step(front_tok, emb, hidden, rows, positions[:, d - 1: d].expand(b, k),
                                      self.k[:, :b], self.v[:, :b], slots[:, (d - 1) * k: d * k].expand(b, k),
                                      mask[:, None, :, : kv + d * k], inputs=inputs)
                n = k * k
                nxt = head.input_spec(emb, out) if d + 1 < self.steps else None
                front_tok, front_score, rows, front_pool, *inputs = topk_expand(
                    head.logits(out), front_score, front_pool, k, target_ids, pool_tok[:, off: off + n],
                    pool_score[:, off: off + n], pool_parent[:, off: off + n], off, mask,
                    masks[d % 2] if d + 1 < self.steps else None, kv, d * k, next_input=nxt,
                    stop=(state, self.stop_log, d + 1) if state is not None else None)
            hidden = out
            off += n
        # the best num_draft nodes by cumulative log-probability, as a tree (of the depths drafted)
        if state is None:
            tokens, parents, depths, ranks = select_tree(roots, pool_tok, pool_score, pool_parent,
                                                         self.pool_depth.expand(b, -1), self.num_draft)
            return Tree(tokens, parents, depths, self.all_valid[:b], self.steps, ranks)
        tokens, parents, depths, ranks, valid = select_tree(roots, pool_tok, pool_score, pool_parent,
                                                            self.pool_depth.expand(b, -1), self.num_draft,
                                                            limit=state[1:2])
        return Tree(tokens, parents, depths, valid, self.steps, ranks)

    def _static(self, h_last, base, kv, roots) -> Tree:
        """Fixed tree shape: node p's token is the rank-p[-1] token of its parent's draft."""
        head, plan = self.head, self._static_plan
        b = h_last.shape[0]
        dev = roots.device
        ctx_mask = torch.arange(kv, device=dev)[None, None, :] < base[:, None, None]
        tokens = torch.zeros(b, plan.n, dtype=torch.long, device=dev)
        ids = head.logits(h_last)[:, 0].topk(plan.first_ranks, dim=-1).indices  # log-softmax keeps the order
        tokens[:, plan.first] = head.draft_to_target(ids[:, plan.first_rank])
        hidden = torch.zeros(b, 1 + plan.n, h_last.shape[-1], dtype=h_last.dtype, device=dev)
        hidden[:, 0] = h_last[:, 0]
        length = kv
        for d, lv in enumerate(plan.levels, start=1):
            m = lv.nodes.numel()
            mask = torch.cat([ctx_mask.expand(b, m, kv), lv.anc.expand(b, -1, -1)], 2)[:, None]
            positions = (base - 1 + d)[:, None].expand(b, m)
            slots = torch.arange(length, length + m, device=dev).expand(b, m)
            out = head.draft_step(tokens[:, lv.nodes], self.embed.weight, hidden, lv.parent_slot.expand(b, -1),
                                  positions, self.k[:, :b], self.v[:, :b], slots, mask)
            length += m
            hidden[:, 1 + lv.nodes] = out
            ids = head.logits(out).topk(lv.ranks, dim=-1).indices  # [B, m, ranks]
            tokens[:, lv.kids] = head.draft_to_target(ids[:, lv.kid_row, lv.kid_rank])
        return Tree(torch.cat([roots[:, None], tokens], 1), plan.parents.expand(b, -1), plan.depth.expand(b, -1),
                    torch.ones(b, plan.n + 1, dtype=torch.bool, device=dev), self.steps)


class _Level:
    pass


class _StaticPlan:
    """A static tree's index tensors, built once on the device (no host work while drafting)."""

    def __init__(self, paths: list[tuple[int, ...]], device):
        index = {p: i for i, p in enumerate(paths)}
        self.n = len(paths)
        first = [i for i, p in enumerate(paths) if len(p) == 1]
        self.first = torch.tensor(first, device=device)
        self.first_rank = torch.tensor([paths[i][0] for i in first], device=device)
        self.first_ranks = 1 + max(paths[i][0] for i in first)
        self.levels = []
        entries: list[int] = []  # tree entries in the order the head computes them
        for d in range(1, max(len(p) for p in paths)):
            level = [i for i, p in enumerate(paths) if len(p) == d]
            kids = [i for i, p in enumerate(paths) if len(p) == d + 1]
            if not kids:
                break
            prev = len(entries)
            anc = torch.zeros(len(level), prev + len(level), dtype=torch.bool)
            for r, i in enumerate(level):
                for a in range(1, d):
                    anc[r, entries.index(index[paths[i][:a]])] = True
                anc[r, prev + r] = True
            lv = _Level()
            lv.nodes = torch.tensor(level, device=device)
            lv.anc = anc.to(device)
            lv.parent_slot = torch.tensor([0 if d == 1 else 1 + index[paths[i][:-1]] for i in level], device=device)
            lv.kids = torch.tensor(kids, device=device)
            lv.kid_row = torch.tensor([level.index(index[paths[i][:-1]]) for i in kids], device=device)
            lv.kid_rank = torch.tensor([paths[i][-1] for i in kids], device=device)
            lv.ranks = 1 + max(paths[i][-1] for i in kids)
            self.levels.append(lv)
            entries += level
        self.parents = torch.tensor([-1] + [0 if len(p) == 1 else 1 + index[p[:-1]] for p in paths], device=device)[None]
        self.depth = torch.tensor([0] + [len(p) for p in paths], device=device)[None]
