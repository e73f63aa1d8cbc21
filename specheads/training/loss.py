"""Soft cross-entropy between the draft and the target, restricted to the draft vocab.

Neither logit matrix is ever materialized for all rows: rows go through in chunks, the
teacher's logits come from the target's final hidden state times the target lm_head rows
of the draft vocab, and the gradients w.r.t. the draft hidden and the draft lm_head are
computed in the same pass (saved for backward). Memory is O(chunk x draft_vocab).
"""

from __future__ import annotations

import torch


class _ChunkedSoftCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, teacher_hidden, teacher_weight, chunk: int):
        # a frozen weight (a head that reads out through the target's own lm_head) gets no gradient:
        # nothing vocabulary-by-hidden is accumulated for it
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_grad = need_hidden or need_weight
        n = hidden.shape[0]
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        for s in range(0, n, chunk):
            h = hidden[s : s + chunk]
            logits = (h @ weight.t()).float()
            t_logits = (teacher_hidden[s : s + chunk] @ teacher_weight.t()).float()
            p = torch.softmax(t_logits, dim=-1)
            logq = torch.log_softmax(logits, dim=-1)
            loss -= (p * logq).sum()
            correct += (logits.argmax(-1) == t_logits.argmax(-1)).sum()
            if need_grad:
                g = (logq.exp() - p).to(h.dtype)  # d(sum loss)/d(logits)
                if need_hidden:
                    grad_hidden[s : s + chunk] = g @ weight
                if need_weight:
                    grad_weight += (g.t() @ h).float()
        if need_grad:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype) if need_weight else None)
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        grad_hidden, grad_weight = ctx.saved_tensors
        return (None if grad_hidden is None else grad_hidden * grad_loss.to(grad_hidden.dtype),
                None if grad_weight is None else grad_weight * grad_loss.to(grad_weight.dtype), None, None, None)


def soft_cross_entropy(hidden, weight, teacher_hidden, teacher_weight, chunk: int = 1024):
    """Sum over rows of -sum_v p_teacher(v) log q_draft(v), and the count of rows whose
    draft argmax equals the teacher argmax.

    hidden [N, H] (normed draft hidden), weight [Vd, H] (draft lm_head),
    teacher_hidden [N, Ht] (target final normed hidden), teacher_weight [Vd, Ht]
    (target lm_head rows of the draft vocab)."""
    if hidden.shape[0] == 0:
        zero = hidden.sum() * 0.0 + weight.sum() * 0.0
        return zero.float(), torch.zeros((), dtype=torch.int64, device=hidden.device)
    return _ChunkedSoftCE.apply(hidden, weight, teacher_hidden, teacher_weight, chunk)


def soft_cross_entropy_reference(hidden, weight, teacher_hidden, teacher_weight):
    """Plain autograd version, for tests."""
    logits = (hidden @ weight.t()).float()
    t_logits = (teacher_hidden @ teacher_weight.t()).float()
    p = torch.softmax(t_logits, dim=-1)
    loss = -(p * torch.log_softmax(logits, dim=-1)).sum()
    correct = (logits.argmax(-1) == t_logits.argmax(-1)).sum()
    return loss, correct
