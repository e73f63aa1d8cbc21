"""The verify forward's attention mask for a batch of draft trees, in one kernel.

Row r verifies its tree (nodes in parent-before-child order, root 0) at cache slots
committed[r] + node, so node i attends to the committed prefix (slots < committed[r]) and
to its ancestors-or-self among the tree's slots. The same ancestor matrix then decides
which drafts the target accepts. In torch this is a dozen launches plus four per tree
level (each level climbs one parent); the kernel walks each node's parents itself.

  parents   [B, N] tree indices (root -1)
  committed [B]
  -> anc [B, N, N] bool (ancestor-or-self), mask [B, N, kv] bool
"""

from __future__ import annotations

import torch

from specheads.kernels.fused import _kernel, triton, use_triton

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
                          DEPTH: tl.constexpr, NP: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        i = tl.program_id(1)  # one node
        j = tl.arange(0, NP)
        row = j == i
        cur = tl.program_id(1).to(tl.int64)
        for _ in tl.static_range(DEPTH):  # climb to the root, one parent per level
            up = tl.load(par_ptr + b * s_pb + tl.maximum(cur, 0) * s_pn)
            cur = tl.where(cur >= 0, up, -1)
            row = row | (j == cur)
        anc_row = anc_ptr + (b * n + i) * n
        tl.store(anc_row + j, row.to(tl.int1), mask=j < n)
        tl.debug_barrier()  # the row is read back below by other threads of this program
        base = tl.load(com_ptr + b)
        for start in range(0, kv, BLOCK):
            c = start + tl.arange(0, BLOCK)
            t = c - base
            in_tree = (t >= 0) & (t < n)
            bit = tl.load(anc_row + t, mask=in_tree, other=0) != 0
            tl.store(mask_ptr + (b * n + i) * kv + c, ((c < base) | bit).to(tl.int1), mask=c < kv)


def tree_masks(parents: torch.Tensor, committed: torch.Tensor, kv: int, max_depth: int):
    if not use_triton(parents):
        return tree_masks_reference(parents, committed, kv, max_depth)
    b, n = parents.shape
    anc = torch.empty(b, n, n, dtype=torch.bool, device=parents.device)
    mask = torch.empty(b, n, kv, dtype=torch.bool, device=parents.device)
    committed = committed.contiguous()
    _kernel(_tree_mask_kernel)[(b, n)](parents, committed, anc, mask, n, kv, parents.stride(0), parents.stride(1),
                                       DEPTH=max_depth, NP=triton.next_power_of_2(n),
                                       BLOCK=min(1024, triton.next_power_of_2(kv)))
    return anc, mask
