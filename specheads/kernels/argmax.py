"""Greedy decoding's pick, the argmax over the vocabulary, as one Triton launch beside torch's.

torch's argmax over [rows, V] runs one thread block a row: on an H200 it took 13 us of a SmolLM2
decode step (~680 us) whether the step verified 1 row or 16. Here a program a (row, chunk of
BLOCK entries) finds its chunk's best, and the last of a row's programs to finish (an atomic
counter, as topk_expand's stage 2) takes the best of the chunks: the row's work spread over the
card. Ties go to the lowest index, as torch's (its first maximal value): the value and the index
are packed into one int64 key (fused.order_key, as the top-k expansion's), so each pick is one max.
-0.0 ties with 0.0 as in torch. A row holding NaN is outside
the contract (torch picks its first NaN; here a positive NaN outranks every number).
"""

from __future__ import annotations

import torch

from specheads.kernels.attention import split_counters
from specheads.kernels import ahead
from specheads.kernels.fused import _kernel, triton, use_triton

if triton is not None:
    import triton.language as tl

    from specheads.kernels.fused import key_index, order_key

BLOCK = 2048  # vocabulary entries a program reads


def argmax_reference(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


if triton is not None:

    def _argmax_kernel(x_ptr, key_ptr, cnt_ptr, out_ptr, n_vocab, n_chunks, s_row,
                       BLOCK: tl.constexpr, CP: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * s_row + offs, mask=offs < n_vocab, other=float("-inf")).to(tl.float32)
        tl.store(key_ptr + row * n_chunks + chunk, tl.max(order_key(x, offs), axis=0))
        # every thread's store is issued before the one-thread atomic, whose acq_rel at gpu scope
        # publishes it and makes the row's other chunks' keys visible to the last program
        tl.debug_barrier()
        done = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
        if done == n_chunks - 1:
            c = tl.arange(0, CP)
            cand = tl.load(key_ptr + row * n_chunks + c, mask=c < n_chunks, other=-9223372036854775807,
                           cache_modifier=".cg")
            top = tl.max(cand, axis=0)
            tl.store(out_ptr + row, key_index(top).to(tl.int64))
            tl.store(cnt_ptr + row, 0)  # ready for the next launch (or graph replay)


@ahead.op
def argmax_last(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> the index of each row's largest value [...] (int64), the lowest index
    among equals; the Triton kernel on GPU (or under TRITON_INTERPRET=1), torch's elsewhere."""
    if not use_triton(logits) or logits.numel() == 0:
        return argmax_reference(logits)
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    rows, dev = flat.shape[0], flat.device
    block = min(BLOCK, triton.next_power_of_2(vocab))
    chunks = triton.cdiv(vocab, block)
    keys = torch.empty(rows * chunks, dtype=torch.int64, device=dev)
    out = torch.empty(rows, dtype=torch.long, device=dev)
    _kernel(_argmax_kernel)[(rows, chunks)](flat, keys, split_counters(dev, rows), out, vocab, chunks, flat.stride(0),
                                            BLOCK=block, CP=triton.next_power_of_2(chunks))
    return out.view(logits.shape[:-1])
