"""Per-node outputs of a verified tree, taken along each row's accepted path.

A drafter that feeds on the target (EAGLE's features, an MTP head's hidden states) commits
a step by reading the target's outputs at the accepted path's nodes: node rows of a
features tensor [B, N, A] and of a token tensor [B, N] (the target's token after each
node), in path order, plus the path's length. Torch does it in five launches (a clamp,
two gathers, two copies); `take_path` is one.

    path  [B, C] node indices, -1 after the path's end (read there: the root, node 0)
    count [B]    the path's length
    -> feats_out [B, C, A], tokens_out [B, C], count_out [B], written in place

With `ring` (the MTP drafter's rings of the last positions), the path's nodes go after the row's
committed length instead: node j's feature at ring row (length + j) % ring, the token after it at
(length + j + 1) % ring, nodes past the path's end not written, and the length advanced by count
(count_out is the length: read, then written).
"""

from __future__ import annotations

import torch

from specheads.kernels import ahead
from specheads.kernels.fused import _kernel, triton, use_triton

if triton is not None:
    import triton.language as tl


def take_path_reference(path, count, feats, tokens, feats_out, tokens_out, count_out, ring=None) -> None:
    at = path.clamp(min=0)
    taken = feats.gather(1, at[:, :, None].expand(-1, -1, feats.shape[-1]))
    after = tokens.gather(1, at)
    if ring is None:
        feats_out.copy_(taken)
        tokens_out.copy_(after)
        count_out.copy_(count)
        return
    row, j = (torch.arange(path.shape[1], device=path.device)[None] < count[:, None]).nonzero(as_tuple=True)
    pos = count_out[row] + j  # the taken nodes' positions
    feats_out[row, pos % ring] = taken[row, j].to(feats_out.dtype)
    tokens_out[row, (pos + 1) % ring] = after[row, j]
    count_out += count


if triton is not None:

    def _take_path_kernel(path_ptr, cnt_ptr, feat_ptr, tok_ptr, fout_ptr, tout_ptr, cout_ptr, n_feat,
                          s_pb, s_fb, s_fn, s_tb, s_ob, s_on, s_tob,
                          COLS: tl.constexpr, CP: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)  # one row
        blk = tl.program_id(1)  # a block of feature columns
        d = tl.arange(0, CP)
        d_ok = d < COLS
        node = tl.load(path_ptr + b * s_pb + d, mask=d_ok, other=0)
        at = tl.maximum(node, 0).to(tl.int64)
        a = blk * BLOCK + tl.arange(0, BLOCK)[None, :]
        a_ok = d_ok[:, None] & (a < n_feat)
        feat = tl.load(feat_ptr + b * s_fb + at[:, None] * s_fn + a, mask=a_ok, other=0.0)
        tl.store(fout_ptr + b * s_ob + d[:, None] * s_on + a, feat, mask=a_ok)
        if blk == 0:
            tl.store(tout_ptr + b * s_tob + d, tl.load(tok_ptr + b * s_tb + at, mask=d_ok, other=0), mask=d_ok)
            tl.store(cout_ptr + b, tl.load(cnt_ptr + b))

    def _ring_path_kernel(path_ptr, cnt_ptr, feat_ptr, tok_ptr, fout_ptr, tout_ptr, len_ptr, n_feat, ring,
                          s_pb, s_fb, s_fn, s_tb, s_ob, s_on, s_tob,
                          COLS: tl.constexpr, CP: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)  # one row, all of its feature columns (it moves the length)
        d = tl.arange(0, CP)
        n = tl.load(cnt_ptr + b)
        base = tl.load(len_ptr + b)
        take = (d < COLS) & (d < n)
        node = tl.load(path_ptr + b * s_pb + d, mask=take, other=0)
        at = tl.maximum(node, 0).to(tl.int64)
        dst = (base + d) % ring
        for a0 in range(0, n_feat, BLOCK):
            a = a0 + tl.arange(0, BLOCK)[None, :]
            ok = take[:, None] & (a < n_feat)
            feat = tl.load(feat_ptr + b * s_fb + at[:, None] * s_fn + a, mask=ok, other=0.0)
            tl.store(fout_ptr + b * s_ob + dst[:, None] * s_on + a, feat, mask=ok)
        tok = tl.load(tok_ptr + b * s_tb + at, mask=take, other=0)
        tl.store(tout_ptr + b * s_tob + (base + d + 1) % ring, tok, mask=take)
        tl.store(len_ptr + b, base + n)


@ahead.op
def take_path(path, count, feats, tokens, feats_out, tokens_out, count_out, ring: int | None = None) -> None:
    """See the module docstring; one launch on GPU (or under TRITON_INTERPRET=1)."""
    b, cols = path.shape
    if ring is not None:
        if feats_out.shape[:2] != (b, tokens_out.shape[1]) or tokens_out.shape[1] < ring or cols > ring:
            raise ValueError(f"ring outputs hold {tuple(tokens_out.shape)} entries for a ring of {ring} and "
                             f"paths of {cols}")
    elif feats_out.shape[:2] != (b, cols) or tokens_out.shape != (b, cols):
        raise ValueError(f"path outputs hold {tuple(tokens_out.shape)} entries; the paths are {(b, cols)}")
    if not use_triton(path):
        return take_path_reference(path, count, feats, tokens, feats_out, tokens_out, count_out, ring)
    assert all(t.stride(-1) == 1 for t in (path, feats, tokens, feats_out, tokens_out))
    assert count.is_contiguous() and count_out.is_contiguous()
    n_feat = feats.shape[-1]
    strides = (path.stride(0), feats.stride(0), feats.stride(1), tokens.stride(0), feats_out.stride(0),
               feats_out.stride(1), tokens_out.stride(0))
    if ring is not None:  # one program a row: it reads the length, then moves it
        _kernel(_ring_path_kernel)[(b,)](path, count, feats, tokens, feats_out, tokens_out, count_out, n_feat, ring,
                                         *strides, COLS=cols, CP=triton.next_power_of_2(cols),
                                         BLOCK=min(1024, triton.next_power_of_2(n_feat)))
        return
    block = min(2048, triton.next_power_of_2(n_feat))
    grid = (b, triton.cdiv(n_feat, block))
    _kernel(_take_path_kernel)[grid](path, count, feats, tokens, feats_out, tokens_out, count_out, n_feat, *strides,
                                     COLS=cols, CP=triton.next_power_of_2(cols), BLOCK=block)
