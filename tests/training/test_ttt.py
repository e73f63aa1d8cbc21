"""Training-time test: the one-pass unroll equals the chain drafter it simulates."""

from __future__ import annotations

import pytest
import torch

from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
from specheads.training.loss import soft_cross_entropy_reference
from specheads.training.ttt import chain_acceptance, opening_mask, shift_left, ttt_loss, ttt_mask, ttt_unroll
from tests.helpers import randomize_

H, V, VD, T = 32, 50, 30, 12


def _head(n_heads, n_kv, seed=0):
    cfg = Eagle3Config(
        hidden_size=H, intermediate_size=48, num_attention_heads=n_heads, num_key_value_heads=n_kv,
        head_dim=8, rms_norm_eps=1e-6, max_position_embeddings=64, vocab_size=V, draft_vocab_size=VD,
        target_hidden_size=H, target_num_layers=6, target_layer_ids=[1, 2, 3],
    )
    torch.manual_seed(seed)
    head = Eagle3Head(cfg)
    randomize_(head, seed, std=0.2)
    d2t = torch.sort(torch.randperm(V)[:VD]).values - torch.arange(VD)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[torch.arange(VD) + d2t] = True
    head.set_vocab_map(d2t, t2d)
    return head.eval()


def _inputs(b=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    embed = torch.nn.Embedding(V, H)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(V, H, generator=g))
    ids = torch.randint(0, V, (b, T), generator=g)
    aux = torch.randn(b, T, 3 * H, generator=g)
    return embed, ids, aux


def chain_reference(head, embed, ids, aux, steps):
    """The chain drafter, one row at a time, with a growing key/value cache:
    row t drafts from the step-0 prefix 0..t, then feeds its own outputs back at
    positions t+1, t+2, ... with the next teacher-forced token's embedding."""
    b, t = ids.shape
    outs = [torch.zeros(b, t, H) for _ in range(steps)]
    pos0 = torch.arange(t).expand(b, t)
    h0, k0, v0 = head.step(embed(shift_left(ids, 1)), head.fc(aux), pos0)
    outs[0] = h0
    for row in range(t):
        k_cache, v_cache = k0[:, :, : row + 1], v0[:, :, : row + 1]
        h = h0[:, row : row + 1]
        for k in range(1, steps):
            nxt = row + 1 + k
            tok = ids[:, nxt] if nxt < t else torch.zeros(b, dtype=torch.long)
            h, kk, vv = head.step(embed(tok)[:, None], h, torch.full((b, 1), row + k), k_cache, v_cache)
            k_cache = torch.cat([k_cache, kk], dim=2)
            v_cache = torch.cat([v_cache, vv], dim=2)
            outs[k][:, row] = h[:, 0]
    return outs


@pytest.mark.parametrize("n_heads, n_kv", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa2", "mqa"])
def test_ttt_unroll_equals_sequential_chain(n_heads, n_kv):
    head = _head(n_heads, n_kv)
    embed, ids, aux = _inputs()
    steps = 4
    with torch.no_grad():
        fast = ttt_unroll(head, embed, ids, aux, steps)
        slow = chain_reference(head, embed, ids, aux, steps)
    assert len(fast) == steps
    for k in range(steps):
        assert fast[k].shape == (2, T, H)
        torch.testing.assert_close(fast[k], slow[k], atol=2e-5, rtol=1e-5, msg=f"step {k}")
    # the steps really differ (the test would be vacuous if they did not)
    assert (fast[1] - fast[0]).abs().max() > 1e-2


def test_step_without_cache_is_causal():
    head = _head(4, 2)
    embed, ids, aux = _inputs(b=1)
    with torch.no_grad():
        full, _, _ = head.step(embed(ids), head.fc(aux), torch.arange(T)[None])
        part, _, _ = head.step(embed(ids[:, :5]), head.fc(aux[:, :5]), torch.arange(5)[None])
    torch.testing.assert_close(full[:, :5], part, atol=1e-5, rtol=0)


@pytest.mark.parametrize("t, step", [(5, 0), (5, 1), (4, 3)])
def test_ttt_mask(t, step):
    m = ttt_mask(t, step, "cpu")
    assert m.shape == (t, (step + 1) * t) and m.dtype == torch.bool
    assert torch.equal(m[:, :t], torch.ones(t, t, dtype=torch.bool).tril())
    for j in range(1, step + 1):
        assert torch.equal(m[:, j * t : (j + 1) * t], torch.eye(t, dtype=torch.bool))
    # row r sees r + 1 prefix keys and one key per later step
    assert m.sum(1).tolist() == [r + 1 + step for r in range(t)]


def test_shift_left():
    x = torch.tensor([[1, 2, 3, 4]])
    assert shift_left(x, 0).tolist() == [[1, 2, 3, 4]]
    assert shift_left(x, 1).tolist() == [[2, 3, 4, 0]]
    assert shift_left(x, 3, fill=-1).tolist() == [[4, -1, -1, -1]]


def test_ttt_loss_alignment():
    """Loss by explicit loops: step k, row t predicts x_{t+2+k} with the teacher at t+1+k."""
    head = _head(4, 2)
    embed, ids, aux = _inputs()
    g = torch.Generator().manual_seed(5)
    target_hidden = torch.randn(2, T, H, generator=g)
    teacher_weight = torch.randn(VD, H, generator=g)
    mask = (torch.rand(2, T, generator=g) > 0.3).long()
    steps, decay = 3, 0.7
    with torch.no_grad():
        stats = ttt_loss(head, embed, ids, mask, aux, target_hidden, teacher_weight, steps, decay, chunk=16)
        outs = ttt_unroll(head, embed, ids, aux, steps)
    denom = sum(int(mask[b, t + 2]) for b in range(2) for t in range(T - 2))
    assert stats.rows == denom
    total = 0.0
    for k in range(steps):
        rows = [(b, t) for b in range(2) for t in range(T) if t + 2 + k < T and mask[b, t + 2 + k]]
        assert stats.step_rows[k] == len(rows)
        with torch.no_grad():
            h = torch.stack([head.norm(outs[k][b, t]) for b, t in rows])
        th = torch.stack([target_hidden[b, t + 1 + k] for b, t in rows])
        with torch.no_grad():
            loss, correct = soft_cross_entropy_reference(h, head.lm_head.weight, th, teacher_weight)
        torch.testing.assert_close(stats.step_loss[k], loss / denom, atol=1e-5, rtol=1e-5)
        assert int(stats.step_correct[k]) == int(correct)
        total += decay**k * float(loss) / denom
    assert float(stats.loss) == pytest.approx(total, rel=1e-5)


def test_chain_acceptance_counts_leading_correct_steps():
    head = _head(4, 2)
    embed, ids, aux = _inputs()
    g = torch.Generator().manual_seed(6)
    target_hidden = torch.randn(2, T, H, generator=g)
    target_lm = torch.randn(V, H, generator=g)
    mask = torch.ones(2, T, dtype=torch.long)
    steps = 3
    with torch.no_grad():
        counts, accept = chain_acceptance(head, embed, ids, mask, aux, target_hidden, target_lm, steps, chunk=5)
        outs = ttt_unroll(head, embed, ids, aux, steps)
    rows = [(b, t) for b in range(2) for t in range(T - 2)]
    assert accept.shape == (len(rows),)
    expected_counts = [0] * steps
    expected_accept = []
    for b, t in rows:
        run, ok_so_far = 1, True
        for k in range(steps):
            draft = head.draft_to_target(head.logits(outs[k][b, t]).argmax())
            target = (target_hidden[b, t + 1 + k] @ target_lm.t()).argmax() if t + 1 + k < T else None
            ok = t + 2 + k < T and bool(draft == target)
            expected_counts[k] += ok
            ok_so_far = ok_so_far and ok
            run += ok_so_far
        expected_accept.append(run)
    assert counts.tolist() == expected_counts
    assert accept.tolist() == expected_accept


def test_ttt_unroll_is_differentiable():
    head = _head(4, 2).train()
    embed, ids, aux = _inputs()
    outs = ttt_unroll(head, embed, ids, aux, 3)
    sum(head.logits(o).logsumexp(-1).sum() for o in outs).backward()
    for name, p in head.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_opening_mask_takes_the_first_answers_first_tokens():
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 1, 1],    # first answer of 4, then a second one
                         [1, 1, 0, 0, 0, 0, 0, 0, 0],    # an answer at the start
                         [0, 0, 0, 0, 0, 0, 0, 0, 0]])   # none
    got = opening_mask(mask, n=3).long()
    assert got.tolist() == [[0, 0, 1, 1, 1, 0, 0, 0, 0],
                            [1, 1, 0, 0, 0, 0, 0, 0, 0],
                            [0, 0, 0, 0, 0, 0, 0, 0, 0]]
    assert opening_mask(mask, n=100).long().sum() == 6
