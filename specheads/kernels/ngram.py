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

from specheads.kernels import ahead
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
                      MAX_NGRAM: tl.constexpr, MIN_NGRAM: tl.constexpr, NPAD: tl.constexpr, BLOCK: tl.constexpr,
                      DRAFT: tl.constexpr):
        row = tl.program_id(0)
        base = h_ptr + row * s_h
        length = tl.load(len_ptr + row)
        root = tl.load(root_ptr + row)
        ns = tl.arange(0, NPAD)
        bests = tl.full((NPAD,), -1, tl.int64)  # at n - 1: the latest position matching the last n tokens so far
        for start in range(0, w, BLOCK):
            p = start + tl.arange(0, BLOCK).to(tl.int64)
            inside = p < w
            m = inside & (p < length) & (tl.load(base + p, mask=inside, other=-1) == root)
            bests = tl.where(ns == 0, tl.maximum(bests, tl.max(tl.where(m, p, -1), 0)), bests)
            for k in tl.static_range(1, MAX_NGRAM):  # n = k + 1: the token k before p equals the suffix's
                back = tl.load(base + tl.maximum(length - k, 0))
                m = m & (p >= k) & (tl.load(base + p - k, mask=inside & (p >= k), other=-1) == back)
                bests = tl.where(ns == k, tl.maximum(bests, tl.max(tl.where(m, p, -1), 0)), bests)
        longest = tl.max(tl.where(bests >= 0, ns, -1), 0)  # the largest n with a match (-1: none)
        best = tl.max(tl.where(ns == longest, bests, -1), 0)
        found = tl.max(tl.where(ns == MIN_NGRAM - 1, bests, -1), 0) >= 0
        tl.store(found_ptr + row, found)
        period = tl.maximum(length - best, 1)
        j = tl.arange(0, DRAFT)
        want = j < n_draft
        c = tl.load(cols_ptr + j, mask=want, other=0).to(tl.int64)
        at = tl.minimum(tl.maximum(best + 1 + c % period, 0), w - 1)
        tl.store(out_ptr + row * n_draft + j, tl.load(base + at, mask=want, other=0), mask=want)


KERNEL_MAX_NGRAM = 8  # the longest suffix the kernel is tested for; a larger max_ngram takes the reference


@ahead.op
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
                                 NPAD=triton.next_power_of_2(max_ngram), BLOCK=min(1024, triton.next_power_of_2(w)),
                                 DRAFT=triton.next_power_of_2(max(n, 1)))
    return drafts, found
