"""Verifying a batch of draft trees: the verify forward's attention mask, and the walk that
accepts the target's path, one kernel each (beside their torch references).

tree_masks:

Row r verifies its tree (nodes in parent-before-child order, root 0) at cache slots
committed[r] + node, so node i attends to the committed prefix (slots < committed[r]) and
to its ancestors-or-self among the tree's slots. The same ancestor matrix then decides
which drafts the target accepts. In torch this is a dozen launches plus four per tree
level (each level climbs one parent); the kernel walks each node's parents itself.

  parents   [B, N] tree indices (root -1)
  committed [B]
  -> anc [B, N, N] bool (ancestor-or-self), mask [B, N, kv] bool

step_inputs is the same launch for a verify step without the cache mask (the target's causal
attention reads the tree from anc and the depths), with each node's validity, position and slot.

accept_path: given the target's token y at every node, the longest path from the root whose
every node is a valid draft equal to y at its parent (the first such sibling when tokens
repeat), its length, last node and the bonus token y[last]; ~25 launches in torch.
"""

from __future__ import annotations

import torch

from specheads.kernels import ahead
from specheads.kernels.fused import _kernel, gdc_launch_dependents, gdc_wait, pdl_options, triton, use_triton

def accept_reference(tokens, parents, valid, depth, anc, y, max_depth: int):
    """Walk the tree the target's way, without a loop over depths: a node is taken when its
    token is the target's choice y at its parent (and it is a valid draft, the first such
    sibling), and it is on the path when it and all its ancestors are taken. Returns the
    path [B, max_depth + 1] (node indices, -1 after its end), its length [B], its last node
    [B] and the bonus token y[last] [B]."""
    b, n = tokens.shape
    dev = y.device
    taken = (tokens == y.gather(1, parents.clamp(min=0))) & valid
    earlier = torch.ones(n, n, dtype=torch.bool, device=dev).tril(-1)  # [i, j]: j < i
    twin = (parents[:, :, None] == parents[:, None, :]) & (tokens[:, :, None] == tokens[:, None, :])
    taken = taken & ~(twin & earlier & taken[:, None, :]).any(-1)  # a repeated sibling: the first one counts
    taken[:, 0] = True  # the root
    on_path = ~(anc & ~taken[:, None, :]).any(-1)
    on_depth = torch.where(on_path, depth, -1)
    last = on_depth.argmax(1)
    n_acc = on_depth.amax(1) + 1
    cols = max_depth + 1
    path = torch.full((b, cols + 1), -1, dtype=torch.long, device=dev)
    path.scatter_(1, torch.where(on_path, depth, cols), torch.arange(n, device=dev).expand(b, n))
    return path[:, :cols], n_acc, last, y.gather(1, last[:, None])[:, 0]


if triton is not None:
    import triton.language as tl


def ancestors_reference(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    b, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n)
    anc = eye.clone()
    parent = parents.clamp(min=0)
    for _ in range(max_depth):  # each pass climbs one level
        anc = eye | (anc.gather(1, parent[:, :, None].expand(b, n, n)) & (parents >= 0)[:, :, None])
    return anc


def tree_masks_reference(parents, committed, kv: int, max_depth: int):
    b, n = parents.shape
    anc = ancestors_reference(parents, max_depth)
    slots = committed[:, None] + torch.arange(n, device=parents.device)
    mask = torch.arange(kv, device=parents.device)[None, None, :] < committed[:, None, None]
    mask = mask.expand(b, n, kv).clone()
    mask.scatter_(2, slots[:, None, :].expand(b, n, n), anc)
    return anc, mask


if triton is not None:

    def _tree_mask_kernel(par_ptr, com_ptr, anc_ptr, mask_ptr, n, kv, s_pb, s_pn,
                          valid_ptr, depth_ptr, rank_ptr, dlim_ptr, rlim_ptr, vout_ptr, pos_ptr, slot_ptr,
                          s_vb, s_vn, s_db, s_dn, s_rb, s_rn,
                          DEPTH: tl.constexpr, NP: tl.constexpr, BLOCK: tl.constexpr, PREP: tl.constexpr,
                          HAS_RANK: tl.constexpr, MASK: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1)  # one node
        if PREP:  # step_inputs: the node's validity under its row's limits, its position and slot
            com = tl.load(com_ptr + b)
            dep = tl.load(depth_ptr + b * s_db + i * s_dn)
            rank = i
            if HAS_RANK:
                rank = tl.load(rank_ptr + b * s_rb + i * s_rn)
            ok = (tl.load(valid_ptr + b * s_vb + i * s_vn) != 0) & (dep <= tl.load(dlim_ptr + b))
            ok = (ok & (rank < tl.load(rlim_ptr + b))) | (i == 0)
            tl.store(vout_ptr + b * n + i, ok.to(tl.int1))
            tl.store(pos_ptr + b * n + i, com + dep)
            tl.store(slot_ptr + b * n + i, com + i)
        j = tl.arange(0, NP)
        row = j == i
        cur = tl.program_id(1).to(tl.int64)
        for _ in tl.static_range(DEPTH):  # climb to the root, one parent per level
            up = tl.load(par_ptr + b * s_pb + tl.maximum(cur, 0) * s_pn)
            cur = tl.where(cur >= 0, up, -1)
            row = row | (j == cur)
        anc_row = anc_ptr + (b * n + i) * n
        tl.store(anc_row + j, row.to(tl.int1), mask=j < n)
        if MASK:  # the node's row of the cache mask (the prefix, then its ancestors' tree slots)
            tl.debug_barrier()  # the row is read back below by other threads of this program
            base = tl.load(com_ptr + b)
            for start in range(0, kv, BLOCK):
                c = start + tl.arange(0, BLOCK)
                t = c - base
                in_tree = (t >= 0) & (t < n)
                bit = tl.load(anc_row + t, mask=in_tree, other=0) != 0
                tl.store(mask_ptr + (b * n + i) * kv + c, ((c < base) | bit).to(tl.int1), mask=c < kv)

    def _accept_kernel(tok_ptr, par_ptr, valid_ptr, depth_ptr, anc_ptr, y_ptr, path_ptr, nacc_ptr, last_ptr,
                       bonus_ptr, n, s_tb, s_pb, s_vb, s_db, s_yb,
                       com_ptr, base_ptr, root_ptr, out_ptr, s_ob,
                       COLS: tl.constexpr, NP: tl.constexpr, CP: tl.constexpr,
                       FINISH: tl.constexpr, PDL: tl.constexpr):
        if PDL:  # fused.pdl_options
            gdc_wait()
            if PDL == 1:  # a grid that fits the card at once (fused.pdl_options)
                gdc_launch_dependents()
        b = tl.program_id(0).to(tl.int64)  # one tree
        i = tl.arange(0, NP)
        ok = i < n
        tok = tl.load(tok_ptr + b * s_tb + i, mask=ok, other=-1)
        par = tl.load(par_ptr + b * s_pb + i, mask=ok, other=-1)
        valid = tl.load(valid_ptr + b * s_vb + i, mask=ok, other=0) != 0
        depth = tl.load(depth_ptr + b * s_db + i, mask=ok, other=0)
        y_par = tl.load(y_ptr + b * s_yb + tl.maximum(par, 0), mask=ok, other=-2)
        taken = (tok == y_par) & valid & ok
        # a repeated sibling (same parent and token) counts once: the first
        twin = ((par[:, None] == par[None, :]) & (tok[:, None] == tok[None, :]) & (i[None, :] < i[:, None])
                & taken[None, :])
        taken = (taken & (tl.sum(twin.to(tl.int32), axis=1) == 0)) | (i == 0)
        # on the path: the node and all its ancestors taken
        anc = tl.load(anc_ptr + (b * n + i[:, None]) * n + i[None, :], mask=ok[:, None] & ok[None, :], other=0) != 0
        on_path = (tl.sum((anc & ~taken[None, :]).to(tl.int32), axis=1) == 0) & ok
        on_depth = tl.where(on_path, depth, -1)
        deepest = tl.max(on_depth, axis=0)
        last = tl.min(tl.where(on_depth == deepest, i, NP), axis=0)
        tl.store(nacc_ptr + b, deepest + 1)
        tl.store(last_ptr + b, last)
        tl.store(bonus_ptr + b, tl.load(y_ptr + b * s_yb + last))
        d = tl.arange(0, CP)
        hit = on_path[:, None] & (depth[:, None] == d[None, :])
        node = tl.sum(tl.where(hit, i[:, None], 0), axis=0)
        found = tl.sum(hit.to(tl.int32), axis=0) > 0
        tl.store(path_ptr + b * COLS + d, tl.where(found, node, -1), mask=d < COLS)
        if FINISH:  # finish_step: the row's state and its result row, in the same launch
            c = tl.load(com_ptr + b)
            tl.store(base_ptr + b, c)  # where the commit moves the path's entries from
            tl.store(com_ptr + b, c + deepest + 1)
            bonus = tl.load(y_ptr + b * s_yb + last)
            tl.store(root_ptr + b, bonus)
            o = out_ptr + b * s_ob
            tl.store(o, deepest + 1)
            tl.store(o + 1, bonus)
            tl.store(o + 2, tl.sum((valid & ok & (i > 0)).to(tl.int64), axis=0))
            tl.store(o + 3, tl.max(tl.where(valid & ok, depth, 0), axis=0))
            at = tl.where(found, node, 0)  # past the path's end: the root, as path.clamp(min=0)
            d_ok = d < COLS
            tl.store(o + 4 + d, tl.load(tok_ptr + b * s_tb + at, mask=d_ok, other=0), mask=d_ok)


def _launch_masks(parents, committed, kv: int | None, max_depth: int, prep=None):
    """The mask kernel over trees [B, N]: anc, the mask over kv cache slots (kv None: no mask),
    and with prep = (valid, depth, rank or None, depth_limit, draft_limit) also (valid under the
    limits, positions, slots)."""
    b, n = parents.shape
    dev = parents.device
    anc = torch.empty(b, n, n, dtype=torch.bool, device=dev)
    mask = torch.empty(b, n, kv, dtype=torch.bool, device=dev) if kv is not None else anc  # (unused)
    committed = committed.contiguous()
    if prep is not None:
        v, d, rank, dlim, rlim = prep
        has_rank = rank is not None
        rank = rank if has_rank else d  # unused without ranks
        out = (torch.empty(b, n, dtype=torch.bool, device=dev), torch.empty(b, n, dtype=torch.long, device=dev),
               torch.empty(b, n, dtype=torch.long, device=dev))
        args = (v, d, rank, dlim.contiguous(), rlim.contiguous(), *out,
                v.stride(0), v.stride(1), d.stride(0), d.stride(1), rank.stride(0), rank.stride(1))
    else:
        has_rank, out = False, ()
        args = (committed,) * 8 + (0,) * 6  # unused
    _kernel(_tree_mask_kernel)[(b, n)](parents, committed, anc, mask, n, kv or 0, parents.stride(0),
                                       parents.stride(1), *args, DEPTH=max_depth, NP=triton.next_power_of_2(n),
                                       BLOCK=min(1024, triton.next_power_of_2(kv or 1)), PREP=prep is not None,
                                       HAS_RANK=has_rank, MASK=kv is not None, **pdl_options(parents, "tree_mask"))
    return (anc,) + ((mask,) if kv is not None else ()) + out


@ahead.op
def tree_masks(parents: torch.Tensor, committed: torch.Tensor, kv: int, max_depth: int):
    if not use_triton(parents):
        return tree_masks_reference(parents, committed, kv, max_depth)
    return _launch_masks(parents, committed, kv, max_depth)


def step_inputs_reference(tree, committed, depth_limit, draft_limit):
    """A verify step's inputs for trees [B, N] (a runtime.tree.Tree): each node's validity
    under its row's limits (depth <= depth_limit, rank < draft_limit; the root always), the
    ancestor matrix, positions committed + depth and cache slots committed + node (the target's
    attention reads the tree from these: no cache mask)."""
    n = tree.size
    valid = tree.valid & (tree.depth <= depth_limit[:, None]) & (tree.ranks() < draft_limit[:, None])
    valid[:, 0] = True
    positions = committed[:, None] + tree.depth
    slots = committed[:, None] + torch.arange(n, device=committed.device)
    return valid, ancestors_reference(tree.parents, tree.max_depth), positions, slots


@ahead.op
def step_inputs(tree, committed, depth_limit, draft_limit):
    """See step_inputs_reference: one launch (the mask kernel without its cache mask), where torch
    takes a dozen."""
    if not use_triton(committed):
        return step_inputs_reference(tree, committed, depth_limit, draft_limit)
    anc, valid, positions, slots = _launch_masks(tree.parents, committed, None, tree.max_depth,
                                                 (tree.valid, tree.depth, tree.rank, depth_limit, draft_limit))
    return valid, anc, positions, slots


def _launch_accept(tokens, parents, valid, depth, anc, y, max_depth: int, finish=None):
    """The accept kernel: (path, accepted, last node, bonus); with finish = (committed, base,
    root, out) also the step's bookkeeping (finish_step_reference)."""
    b, n = tokens.shape
    dev = y.device
    cols = max_depth + 1
    path = torch.empty(b, cols, dtype=torch.long, device=dev)
    n_acc, last, bonus = (torch.empty(b, dtype=torch.long, device=dev) for _ in range(3))
    assert anc.is_contiguous() and all(t.stride(-1) == 1 for t in (tokens, parents, valid, depth, y))
    if finish is not None:
        committed, base, root, out = finish
        assert out.stride(-1) == 1 and committed.is_contiguous() and base.is_contiguous() and root.is_contiguous()
        state = (committed, base, root, out, out.stride(0))
    else:
        state = (n_acc,) * 4 + (0,)  # unused
    _kernel(_accept_kernel)[(b,)](tokens, parents, valid, depth, anc, y, path, n_acc, last, bonus, n,
                                  tokens.stride(0), parents.stride(0), valid.stride(0), depth.stride(0), y.stride(0),
                                  *state,
                                  COLS=cols, NP=triton.next_power_of_2(n), CP=triton.next_power_of_2(cols),
                                  FINISH=finish is not None, **pdl_options(y, "accept"))
    return path, n_acc, last, bonus


@ahead.op
def accept(tokens, parents, valid, depth, anc, y, max_depth: int):
    """See accept_reference; Triton on GPU (or under TRITON_INTERPRET=1)."""
    if not use_triton(y):
        return accept_reference(tokens, parents, valid, depth, anc, y, max_depth)
    return _launch_accept(tokens, parents, valid, depth, anc, y, max_depth)


def finish_step_reference(tokens, parents, valid, depth, anc, y, max_depth: int, committed, base, root, out):
    """Accept each row's path (accept_reference) and finish the step in place: base = the
    committed length before it (where the KV commit reads), committed += accepted, root =
    bonus, out rows [accepted, bonus, drafted, deepest valid depth, path tokens...] (past the
    path's end: the root's token). Returns (path, accepted). A drafter takes what it needs
    from the path afterwards (its `commit`)."""
    path, n_acc, _, bonus = accept_reference(tokens, parents, valid, depth, anc, y, max_depth)
    base.copy_(committed)
    committed += n_acc
    root.copy_(bonus)
    at = path.clamp(min=0)
    out[:, 0] = n_acc
    out[:, 1] = bonus
    out[:, 2] = valid[:, 1:].sum(1)
    out[:, 3] = (depth * valid).amax(1)
    out[:, 4: 4 + at.shape[1]] = tokens.gather(1, at)
    return path, n_acc


@ahead.op
def finish_step(tokens, parents, valid, depth, anc, y, max_depth: int, committed, base, root, out):
    """See finish_step_reference; one launch (the accept kernel) on GPU or under TRITON_INTERPRET=1."""
    if not use_triton(y):
        return finish_step_reference(tokens, parents, valid, depth, anc, y, max_depth, committed, base, root, out)
    path, n_acc, _, _ = _launch_accept(tokens, parents, valid, depth, anc, y, max_depth, (committed, base, root, out))
    return path, n_acc
