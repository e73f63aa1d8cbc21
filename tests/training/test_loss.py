"""The chunked soft cross-entropy (custom autograd) against the plain autograd reference."""

from __future__ import annotations

import pytest
import torch

from specheads.training.loss import soft_cross_entropy, soft_cross_entropy_reference


def _tensors(n=37, h=16, ht=24, vd=29, seed=0, scale=2.0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g) * scale).requires_grad_()
    weight = (torch.randn(vd, h, generator=g) * 0.5).requires_grad_()
    teacher_hidden = torch.randn(n, ht, generator=g) * scale
    teacher_weight = torch.randn(vd, ht, generator=g) * 0.5
    # make some rows agree with the teacher so `correct` is neither 0 nor n
    with torch.no_grad():
        hidden[: n // 3] = 0
        weight_arg = (teacher_hidden[: n // 3] @ teacher_weight.t()).argmax(-1)
        hidden[torch.arange(n // 3)] += weight[weight_arg] * 20
    return hidden, weight, teacher_hidden, teacher_weight


@pytest.mark.parametrize("chunk", [5, 16, 37, 1024])
def test_matches_reference_value_count_and_gradients(chunk):
    hidden, weight, th, tw = _tensors()
    loss, correct = soft_cross_entropy(hidden, weight, th, tw, chunk)
    (3.0 * loss).backward()  # a non-unit upstream gradient
    g_hidden, g_weight = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref_loss, ref_correct = soft_cross_entropy_reference(hidden, weight, th, tw)
    (3.0 * ref_loss).backward()
    assert loss.dtype == torch.float32 and loss.ndim == 0
    torch.testing.assert_close(loss, ref_loss, atol=1e-4, rtol=1e-5)
    assert int(correct) == int(ref_correct)
    assert 0 < int(correct) < hidden.shape[0]
    torch.testing.assert_close(g_hidden, hidden.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(g_weight, weight.grad, atol=1e-5, rtol=1e-4)
    assert not correct.requires_grad


def test_gradients_through_a_graph():
    """The chunked function composes with autograd upstream (hidden computed from a parameter)."""
    _, weight, th, tw = _tensors()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(37, 8, generator=g)
    proj = torch.randn(8, 16, generator=g).requires_grad_()
    loss, _ = soft_cross_entropy(x @ proj, weight, th, tw, 7)
    loss.backward()
    grad = proj.grad.clone()
    proj.grad = None
    ref, _ = soft_cross_entropy_reference(x @ proj, weight, th, tw)
    ref.backward()
    torch.testing.assert_close(grad, proj.grad, atol=1e-4, rtol=1e-4)


def test_perfect_student_has_teacher_entropy():
    hidden, weight, th, tw = _tensors()
    with torch.no_grad():
        loss, correct = soft_cross_entropy(th, tw, th, tw, 8)
        p = torch.softmax(th @ tw.t(), -1)
        entropy = -(p * p.log()).sum()
    torch.testing.assert_close(loss, entropy, atol=1e-4, rtol=1e-5)
    assert int(correct) == th.shape[0]


def test_no_grad_inputs():
    hidden, weight, th, tw = _tensors()
    loss, correct = soft_cross_entropy(hidden.detach(), weight.detach(), th, tw, 8)
    ref, ref_correct = soft_cross_entropy_reference(hidden.detach(), weight.detach(), th, tw)
    torch.testing.assert_close(loss, ref, atol=1e-4, rtol=1e-5)
    assert not loss.requires_grad


def test_empty_input_gives_zero_loss():
    _, weight, _, tw = _tensors()
    hidden = torch.zeros(0, 16, requires_grad=True)
    loss, correct = soft_cross_entropy(hidden, weight, torch.zeros(0, 24), tw, 8)
    assert float(loss.detach()) == 0.0 and int(correct) == 0
    assert loss.dtype == torch.float32
    loss.backward()  # still part of the graph, with zero gradients
    assert weight.grad is not None and float(weight.grad.abs().sum()) == 0.0
