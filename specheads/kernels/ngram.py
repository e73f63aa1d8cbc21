"""The device n-gram lookup (drafters/ngram.py, DeviceNgramDrafter) in one launch, beside its torch
reference.

Row r's tokens h[r, :L] (L = length[r]) end before its root, the last emitted token. For n = 1 ..
max_ngram, a position p < L matches when the n tokens ending at p equal the n ending at the root
(h[p] == root, h[p-1] == h[L-1], h[p-2] == h[L-2], ...). The row's match is the latest p of the
largest n that has one; its drafts are the tokens from p+1 on, the i-th at p+1 + (i mod (L-p)) (a
continuation that runs into the suffix repeats with the period it found).

In torch that is about 35 small launches at max_ngram 3 (on an H200 a plain step of an n-gram
engine, which runs the lookup's first position, took 0.752 ms at batch 1 against `ar`'s 0.667);
the kernel is one program per row, scanning its context in blocks.

  h [B, W] (a row stride of its own; W: the step's context bucket), length [B], roots [B],
  draft_cols [N] (the chain positions wanted)  ->  drafts [B, N], found [B] bool

`min_ngram` (default 1): a row counts as found only where its match is at least that many tokens
long (the drafts are the same); the n-gram assist of a head's tree (drafters/assist.py) drafts
the chain only where the suffix matched 3 tokens or more.
"""

from __future__ import annotations

import torch

from specheads.kernels.fused import _kernel, triton, use_triton


def ngram_lookup_reference(h: torch.Tensor, length: torch.Tensor, roots: torch.Tensor, draft_cols: torch.Tensor,
                           max_ngram: int, min_ngram: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    b, w = h.shape
    cols = torch.arange(w, device=h.device)
    match = (h == roots[:, None]) & (cols[None] < length[:, None])  # n = 1, ending before the root
    best = torch.where(match, cols[None], -1).amax(1)
    found = best >= 0
    for n in range(2, max_ngram + 1):
        back = h.gather(1, (length - n + 1).clamp(min=0)[:, None])  # the suffix's n-th token from the end
        same = torch.zeros_like(match)
        same[:, n - 1:] = h[:, : w - n + 1] == back  # at p: the token n-1 before p equals it
        match &= same
        p = torch.where(match, cols[None], -1).amax(1)
        best = torch.where(p >= 0, p, best)
        if n == min_ngram:
            found = p >= 0
    period = (length - best).clamp(min=1)
    at = best[:, None] + 1 + draft_cols[None] % period[:, None]
    return h.gather(1, at.clamp(0, w - 1)), found


if triton is not None:
    import triton.language as tl

    def _ngram_kernel(h_ptr, len_ptr, root_ptr, cols_ptr, out_ptr, found_ptr, w, s_h, n_draft,
                      MAX_NGRAM: tl.constexpr, MIN_NGRAM: tl.constexpr, BLOCK: tl.constexpr, DRAFT: tl.constexpr):
        row = tl.program_id(0)
        base = h_ptr + row * s_h
        length = tl.load(len_ptr + row)
        root = tl.load(root_ptr + row)
        # best position of each n (n = 1 .. MAX_NGRAM, unrolled up to KERNEL_MAX_NGRAM), the latest match so far
        best1 = tl.full((), -1, tl.int64)
        best2 = tl.full((), -1, tl.int64)
        best3 = tl.full((), -1, tl.int64)
        best4 = tl.full((), -1, tl.int64)
        best5 = tl.full((), -1, tl.int64)
        best6 = tl.full((), -1, tl.int64)
        best7 = tl.full((), -1, tl.int64)
        best8 = tl.full((), -1, tl.int64)
        back1 = tl.load(base + tl.maximum(length - 1, 0))  # the suffix's 2nd token from the end
        back2 = tl.load(base + tl.maximum(length - 2, 0))
        back3 = tl.load(base + tl.maximum(length - 3, 0))
        back4, back5, back6, back7 = root, root, root, root  # (loaded only where MAX_NGRAM reaches them)
        if MAX_NGRAM >= 5:
            back4 = tl.load(base + tl.maximum(length - 4, 0))
        if MAX_NGRAM >= 6:
            back5 = tl.load(base + tl.maximum(length - 5, 0))
        if MAX_NGRAM >= 7:
            back6 = tl.load(base + tl.maximum(length - 6, 0))
        if MAX_NGRAM >= 8:
            back7 = tl.load(base + tl.maximum(length - 7, 0))
        for start in range(0, w, BLOCK):
            p = start + tl.arange(0, BLOCK).to(tl.int64)
            inside = p < w
            m = inside & (p < length) & (tl.load(base + p, mask=inside, other=-1) == root)
            best1 = tl.maximum(best1, tl.max(tl.where(m, p, -1), 0))
            if MAX_NGRAM >= 2:
                m = m & (p >= 1) & (tl.load(base + p - 1, mask=inside & (p >= 1), other=-1) == back1)
                best2 = tl.maximum(best2, tl.max(tl.where(m, p, -1), 0))
            if MAX_NGRAM >= 3:
                m = m & (p >= 2) & (tl.load(base + p - 2, mask=inside & (p >= 2), other=-1) == back2)
                best3 = tl.maximum(best3, tl.max(tl.where(m, p, -1), 0))
            if MAX_NGRAM >= 4:
                m = m & (p >= 3) & (tl.load(base + p - 3, mask=inside & (p >= 3), other=-1) == back3)
                best4 = tl.maximum(best4, tl.max(tl.where(m, p, -1), 0))
            if MAX_NGRAM >= 5:
                m = m & (p >= 4) & (tl.load(base + p - 4, mask=inside & (p >= 4), other=-1) == back4)
                best5 = tl.maximum(best5, tl.max(tl.where(m, p, -1), 0))
            if MAX_NGRAM >= 6:
                m = m & (p >= 5) & (tl.load(base + p - 5, mask=inside & (p >= 5), other=-1) == back5)
                best6 = tl.maximum(best6, tl.max(tl.where(m, p, -1), 0))
            if MAX_NGRAM >= 7:
                m = m & (p >= 6) & (tl.load(base + p - 6, mask=inside & (p >= 6), other=-1) == back6)
                best7 = tl.maximum(best7, tl.max(tl.where(m, p, -1), 0))
            if MAX_NGRAM >= 8:
                m = m & (p >= 7) & (tl.load(base + p - 7, mask=inside & (p >= 7), other=-1) == back7)
                best8 = tl.maximum(best8, tl.max(tl.where(m, p, -1), 0))
        best = best1
        if MAX_NGRAM >= 2:
            best = tl.where(best2 >= 0, best2, best)
        if MAX_NGRAM >= 3:
            best = tl.where(best3 >= 0, best3, best)
        if MAX_NGRAM >= 4:
            best = tl.where(best4 >= 0, best4, best)
        if MAX_NGRAM >= 5:
            best = tl.where(best5 >= 0, best5, best)
        if MAX_NGRAM >= 6:
            best = tl.where(best6 >= 0, best6, best)
        if MAX_NGRAM >= 7:
            best = tl.where(best7 >= 0, best7, best)
        if MAX_NGRAM >= 8:
            best = tl.where(best8 >= 0, best8, best)
        found = best >= 0
        if MIN_NGRAM == 2:
            found = best2 >= 0
        if MIN_NGRAM == 3:
            found = best3 >= 0
        if MIN_NGRAM == 4:
            found = best4 >= 0
        if MIN_NGRAM == 5:
            found = best5 >= 0
        if MIN_NGRAM == 6:
            found = best6 >= 0
        if MIN_NGRAM == 7:
            found = best7 >= 0
        if MIN_NGRAM == 8:
            found = best8 >= 0
        tl.store(found_ptr + row, found)
        period = tl.maximum(length - best, 1)
        j = tl.arange(0, DRAFT)
        want = j < n_draft
        c = tl.load(cols_ptr + j, mask=want, other=0).to(tl.int64)
        at = tl.minimum(tl.maximum(best + 1 + c % period, 0), w - 1)
        tl.store(out_ptr + row * n_draft + j, tl.load(base + at, mask=want, other=0), mask=want)


KERNEL_MAX_NGRAM = 8  # the kernel's unrolled n; a larger max_ngram takes the reference


def ngram_lookup(h: torch.Tensor, length: torch.Tensor, roots: torch.Tensor, draft_cols: torch.Tensor,
                 max_ngram: int, min_ngram: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts [B, N], found [B]): the kernel on GPU (or under TRITON_INTERPRET=1), else the reference."""
    if not 1 <= min_ngram <= max_ngram:
        raise ValueError(f"min_ngram must be in [1, max_ngram={max_ngram}], got {min_ngram}")
    b, w = h.shape
    n = draft_cols.shape[0]
    if (not use_triton(h) or max_ngram > KERNEL_MAX_NGRAM or h.stride(1) != 1 or h.dtype != torch.long
            or b == 0):
        return ngram_lookup_reference(h, length, roots, draft_cols, max_ngram, min_ngram)
    drafts = torch.empty(b, n, dtype=h.dtype, device=h.device)
    found = torch.empty(b, dtype=torch.bool, device=h.device)
    _kernel(_ngram_kernel)[(b,)](h, length.contiguous(), roots.contiguous(), draft_cols.contiguous(), drafts, found,
                                 w, h.stride(0), n, MAX_NGRAM=max_ngram, MIN_NGRAM=min_ngram,
                                 BLOCK=min(1024, triton.next_power_of_2(w)), DRAFT=triton.next_power_of_2(max(n, 1)))
    return drafts, found
