"""Training-time test (TTT): the head is unrolled for `steps` draft steps in one pass.

Alignment, for a sequence x_0..x_{T-1} with target features f_t (tokens <= t):
  step k, row t: embedding of x_{t+1+k}, hidden = fc(f_t) at k=0, else the head's own
  step-(k-1) output at row t; rotary position t + k; predicts x_{t+2+k}; its teacher is
  the target's distribution at position t+1+k; counted where x_{t+2+k} is an assistant
  token.
Attention at step k, row t: the step-0 keys of rows 0..t (causal) plus the step-j keys of
row t itself for j = 1..k. That is exactly what the chain drafter sees at inference:
the prefix from target features, then its own earlier draft tokens at positions t+1..t+k.
We run it as one SDPA call over keys [step 0 | step 1 | ... | step k] with a block mask
(causal block, then diagonal blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specheads.modules import gqa_attention
from specheads.training.loss import soft_cross_entropy


def shift_left(x: torch.Tensor, n: int, fill=0) -> torch.Tensor:
    """x[:, t] <- x[:, t + n], padding the end with `fill`."""
    if n == 0:
        return x
    pad = torch.full_like(x[:, :n], fill)
    return torch.cat([x[:, n:], pad], dim=1)


def ttt_mask(t: int, step: int, device) -> torch.Tensor:
    """Bool [T, (step+1) * T]: causal over step-0 keys, diagonal over each later step's keys."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_unroll(head, embed, input_ids: torch.Tensor, aux_hidden: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """The EAGLE-3 head's unroll (its registry entry's `unroll`): the head's output hidden
    (pre-norm, after its last decoder layer) of each step, [B, T, H] each. Each decoder layer
    keeps its own keys and values over the steps, as each has its own KV cache when drafting."""
    b, t = input_ids.shape
    max_pos = head.rotary.max_positions - 1
    hidden = head.fc(aux_hidden)
    layers = head.decoder_layers()
    base = torch.arange(t, device=input_ids.device)
    keys, values = [[] for _ in layers], [[] for _ in layers]
    outputs = []
    for k in range(steps):
        embeds = embed(shift_left(input_ids, 1 + k)).to(hidden.dtype)
        cos, sin = head.rotary((base + k).clamp(max=max_pos).expand(b, t), hidden.dtype)
        mask = ttt_mask(t, k, input_ids.device)[None, None]
        for i, layer in enumerate(layers):
            q, key, value = layer.self_attn.qkv(layer.attn_input(embeds, hidden), cos, sin)
            keys[i].append(key)
            values[i].append(value)
            out = gqa_attention(q, torch.cat(keys[i], 2), torch.cat(values[i], 2), mask)
            hidden = layer.finish(out, hidden)
        outputs.append(hidden)
    return outputs


@dataclass
class StepStats:
    loss: torch.Tensor  # weighted, normalized: what backward runs on
    step_loss: list  # per step, normalized by the step-0 row count
    step_correct: list  # per step: rows whose draft argmax == teacher argmax
    step_rows: list  # per step: rows counted
    rows: int


def depth_weight(decay: float | Sequence[float], k: int) -> float:
    """The loss weight of unroll depth k: decay**k (train.step_decay), or decay[k] where a weight is
    given per depth (train.depth_weights)."""
    return decay ** k if isinstance(decay, (int, float)) else float(decay[k])


def ttt_loss(
    head,
    embed,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden: torch.Tensor,
    target_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    steps: int = 7,
    decay: float | Sequence[float] = 0.8,
    chunk: int = 1024,
    outputs: list[torch.Tensor] | None = None,
) -> StepStats:
    """Any head kind's loss over the steps of an unroll: soft cross-entropy of the head's
    readout against the teacher, step k weighted decay**k (or decay[k]: depth_weight).

    `outputs`: the unroll for these inputs (the trainer passes its kind's; None runs
    `ttt_unroll`)."""
    if outputs is None:
        outputs = ttt_unroll(head, embed, input_ids, aux_hidden, steps)
    mask0 = shift_left(loss_mask, 2).bool()
    denom = max(int(mask0.sum()), 1)
    total = 0.0
    step_loss, step_correct, step_rows = [], [], []
    for k, hidden in enumerate(outputs):
        rows = shift_left(loss_mask, 2 + k).bool()
        h, weight = head.readout(hidden[rows], k)
        th = shift_left(target_hidden, 1 + k)[rows]
        loss_sum, correct = soft_cross_entropy(h, weight, th.to(h.dtype), teacher_weight.to(h.dtype), chunk)
        loss_k = loss_sum / denom
        total = total + depth_weight(decay, k) * loss_k
        step_loss.append(loss_k.detach())
        step_correct.append(correct)
        step_rows.append(int(rows.sum()))
    return StepStats(total, step_loss, step_correct, step_rows, denom)


def opening_mask(loss_mask: torch.Tensor, n: int = 256) -> torch.Tensor:
    """The first n tokens of each sequence's first assistant turn: what a chat user sees first,
    and what a benchmark of first-turn prompts decodes. Long regenerated answers of small
    models loop, and their easy tails inflate an average over all assistant positions."""
    m = loss_mask.bool()
    starts = m & ~torch.nn.functional.pad(m, (1, 0))[:, :-1]
    first = m & (starts.long().cumsum(1) == 1)
    return first & (first.long().cumsum(1) <= n)


@torch.no_grad()
def chain_acceptance(
    head,
    embed,
    input_ids: torch.Tensor,
    loss_mask: torch.Tensor,
    aux_hidden: torch.Tensor,
    target_hidden: torch.Tensor,
    target_lm_head: torch.Tensor,
    steps: int = 7,
    chunk: int = 4096,
    outputs: list[torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Simulated greedy chain drafting on teacher-forced inputs.

    For every row t whose next-next token is an assistant token: correct[k, t] says the
    draft's step-k token (mapped to target ids) equals the target's full-vocab argmax at
    position t+1+k. Returns (per-step accuracy counts [steps], accept lengths [rows]),
    where accept length = 1 (the bonus token) + leading correct steps.
    """
    if outputs is None:
        outputs = ttt_unroll(head, embed, input_ids, aux_hidden, steps)
    base = shift_left(loss_mask, 2).bool()
    correct = []
    for k, hidden in enumerate(outputs):
        valid = shift_left(loss_mask, 2 + k).bool() & base
        h, weight = head.readout(hidden[base], k)
        th = shift_left(target_hidden, 1 + k)[base]
        draft_tok = torch.cat([head.draft_to_target((h[s : s + chunk] @ weight.t()).argmax(-1))
                               for s in range(0, h.shape[0], chunk)]) if h.shape[0] else h.new_zeros(0, dtype=torch.long)
        target_tok = torch.cat([(th[s : s + chunk] @ target_lm_head.t().to(th.dtype)).argmax(-1)
                                for s in range(0, th.shape[0], chunk)]) if th.shape[0] else draft_tok
        correct.append((draft_tok == target_tok) & valid[base])
    c = torch.stack(correct)  # [steps, rows]
    accept = 1 + c.long().cumprod(0).sum(0)
    return c.sum(1), accept
