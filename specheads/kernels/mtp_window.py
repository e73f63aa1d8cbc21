"""The MTP drafter's per-step inputs for every module at once, in one launch.

A step runs module d (0..D-1) over the window of the last W positions (L-W .. L-1, L the row's
committed length) and, from module 1 on, over the k frontier nodes (at position L-1, cache slots
kv .. kv+k-1), in one call per module. Module d's window entry at position p reads the token at
p + 1 + d, and is known once p >= 0 and p + 1 + d <= L; an unknown entry goes to the discard slot
(the last column) and sees only itself; a known one sees the earlier cache entries and itself; a
frontier node sees module d's entries up to L-1-d (written in the same call) and itself.

    length [b], ring_tokens [b, >= ring] (token of position q at q mod ring)
    -> tokens [D, b, W + k], rows [D, b, W + k], positions [b, W + k],
       slots [D, b, W + k], mask bool [D, b, 1, W + k, width]

rows: where each query's hidden input sits: module 0's in the feature ring (p mod ring),
module d >= 1's in module d-1's output (entry j at row j). The frontier's columns of tokens and
rows (the last k) are zero here: the drafter's top-k expansion of depth d writes module d+1's
there (kernels/draft.py, topk_expand's tok_out and parent_out), so no step concatenates them.

Torch builds these in about twenty small launches a step; the kernel in one.
"""

from __future__ import annotations

import torch

from specheads.kernels import ahead
from specheads.kernels.fused import _kernel, triton, use_triton

if triton is not None:
    import triton.language as tl


def mtp_window_reference(length, ring_tokens, window: int, ring: int, modules: int, kv: int, width: int, k: int):
    dev = length.device
    b = length.shape[0]
    pos = length[:, None] + torch.arange(window, device=dev) - window  # [b, W]: L-W .. L-1
    pos0 = pos.clamp(min=0)
    cols = torch.arange(width, device=dev)
    lag = torch.arange(1, modules + 1, device=dev)[:, None, None]  # 1 + d, [D, 1, 1]
    after = pos[None] + lag  # [D, b, W]: the position of each entry's input token
    tokens = ring_tokens.gather(1, (after % ring).transpose(0, 1).reshape(b, -1))
    tokens = tokens.view(b, modules, window).transpose(0, 1)
    rows = torch.cat([(pos % ring)[None], torch.arange(window, device=dev).expand(modules - 1, b, window)])
    free = torch.zeros(modules, b, k, dtype=torch.long, device=dev)  # the frontier's, written later
    known = (pos[None] >= 0) & (after <= length[None, :, None])
    front = (torch.arange(k, device=dev) + kv).expand(modules, b, k)
    slots = torch.cat([torch.where(known, pos0[None], width - 1), front], 2)  # [D, b, W + k]
    seen = torch.cat([(cols < pos0[:, :, None]) & known[..., None],  # earlier entries, if known
                      (cols <= length[:, None, None] - lag[..., None]).expand(-1, -1, k, -1)], 2)
    mask = (seen | (cols == slots[..., None]))[:, :, None]
    positions = torch.cat([pos0, pos0[:, -1:].expand(b, k)], 1)  # the frontier at L-1
    return torch.cat([tokens, free.to(tokens.dtype)], 2), torch.cat([rows, free], 2), positions, slots, mask


if triton is not None:

    def _mtp_window_kernel(len_ptr, rtok_ptr, tok_ptr, rrow_ptr, pos_ptr, slot_ptr, mask_ptr,
                           n_rows, window, ring, kv, width, k, s_rt,
                           NP: tl.constexpr, BLOCK_S: tl.constexpr):
        d = tl.program_id(0)  # one module
        b = tl.program_id(1).to(tl.int64)  # one batch row
        n_q = window + k
        j = tl.arange(0, NP)  # the call's queries: the window's entries, then the frontier
        on = j < n_q
        is_win = j < window
        length = tl.load(len_ptr + b)
        pos = length - window + j
        pos0 = tl.maximum(pos, 0)
        after = pos + 1 + d
        known = is_win & (pos >= 0) & (after <= length)
        slot = tl.where(is_win, tl.where(known, pos0, width - 1), kv + j - window)
        row = d * n_rows + b  # (module, batch row)
        tl.store(slot_ptr + row * n_q + j, slot, mask=on)
        at = ((after % ring) + ring) % ring  # a floor modulo: positions before 0 wrap as torch's do
        tok = tl.load(rtok_ptr + b * s_rt + at, mask=is_win, other=0)
        tl.store(tok_ptr + row * n_q + j, tok, mask=on)  # the frontier's: 0 (written by the expansion)
        # module 0 reads the feature ring (p mod ring), module d >= 1 the previous module's output row j
        hrow = tl.where(d == 0, ((pos % ring) + ring) % ring, j)
        tl.store(rrow_ptr + row * n_q + j, tl.where(is_win, hrow, 0), mask=on)
        if d == 0:
            last = tl.maximum(length - 1, 0)
            tl.store(pos_ptr + b * n_q + j, tl.where(is_win, pos0, last), mask=on)
        seen_to = tl.where(is_win, tl.where(known, pos0 - 1, -1), length - 1 - d)  # last column seen, besides its own
        for c0 in range(0, width, BLOCK_S):
            cols = c0 + tl.arange(0, BLOCK_S)
            m = (cols[None, :] <= seen_to[:, None]) | (cols[None, :] == slot[:, None])
            tl.store(mask_ptr + (row * n_q + j[:, None]) * width + cols[None, :], m.to(tl.int8),
                     mask=on[:, None] & (cols[None, :] < width))


@ahead.op
def mtp_window(length, ring_tokens, window: int, ring: int, modules: int, kv: int, width: int, k: int):
    """See the module docstring; one launch on GPU (or under TRITON_INTERPRET=1)."""
    if not use_triton(length):
        return mtp_window_reference(length, ring_tokens, window, ring, modules, kv, width, k)
    assert length.is_contiguous() and ring_tokens.stride(-1) == 1
    b = length.shape[0]
    dev = length.device
    n_q = window + k
    tokens = torch.empty(modules, b, n_q, dtype=ring_tokens.dtype, device=dev)
    rows = torch.empty(modules, b, n_q, dtype=torch.long, device=dev)
    positions = torch.empty(b, n_q, dtype=torch.long, device=dev)
    slots = torch.empty(modules, b, n_q, dtype=torch.long, device=dev)
    mask = torch.empty(modules, b, 1, n_q, width, dtype=torch.bool, device=dev)
    _kernel(_mtp_window_kernel)[(modules, b)](
        length, ring_tokens, tokens, rows, positions, slots, mask.view(torch.int8),
        b, window, ring, kv, width, k, ring_tokens.stride(0),
        NP=triton.next_power_of_2(n_q), BLOCK_S=min(512, triton.next_power_of_2(width)))
    return tokens, rows, positions, slots, mask
