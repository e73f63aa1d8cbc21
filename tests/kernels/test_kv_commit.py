"""The KV commit: the Triton kernel (through Triton's CPU interpreter) against the torch
reference and against an independent expectation, including the overlapping-path case."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

from specheads.kernels import kv_commit
from specheads.kernels.kv_commit import commit_kv, commit_kv_reference
from tests.kernels.interpret import interpreted_commit_kernel, needs_triton

POISON = -1234.5  # every slot outside the tree regions holds this; it must survive the commit


@pytest.fixture
def interpreted(monkeypatch):
    return interpreted_commit_kernel(monkeypatch)


def _case(seed, layers, batch, heads, max_len, head_dim, m, tree_nodes, dtype=torch.float32):
    """A cache with random values in each row's tree region [base, base + tree_nodes) and
    POISON elsewhere; paths with src[0] = 0 and increasing node ids, -1 after n (as the
    engine passes them). Row 0 accepts m entries along 0, 2, 3, ..., m (each source the
    destination of the next entry), row 1 (if any) only the root, the others at random."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    cache = torch.full((layers, batch, heads, max_len, head_dim), POISON)
    base = torch.zeros(batch, dtype=torch.long)
    src = torch.full((batch, m), -1, dtype=torch.long)
    n = torch.zeros(batch, dtype=torch.long)
    for b in range(batch):
        nb = m if b == 0 else 1 if b == 1 else rng.randint(1, m)
        start = rng.randint(0, max_len - tree_nodes)
        ids = sorted(rng.sample(range(1, tree_nodes), nb - 1))
        if b == 0 and m < tree_nodes - 1:
            ids = list(range(2, m + 1))
        base[b], n[b] = start, nb
        src[b, :nb] = torch.tensor([0] + ids)
        cache[:, b, :, start: start + tree_nodes] = torch.randn(layers, heads, tree_nodes, head_dim, generator=g)
    return cache.to(dtype), base, src, n


def _expected(cache, base, src, n):
    """Entry i of each row's path, read from the cache before any write, lands at base + i."""
    out = cache.clone()
    for b in range(cache.shape[1]):
        for i in range(int(n[b])):
            out[:, b, :, int(base[b]) + i] = cache[:, b, :, int(base[b]) + int(src[b, i])]
    return out


def _assert_untouched_outside(after, before, base, n):
    for b in range(after.shape[1]):
        lo, hi = int(base[b]), int(base[b]) + int(n[b])
        keep = torch.ones(after.shape[3], dtype=torch.bool)
        keep[lo:hi] = False
        assert torch.equal(after[:, b, :, keep], before[:, b, :, keep]), f"row {b}: slots outside {lo}..{hi - 1} changed"


def _has_overlap(src, n):
    """Some path entry j reads a slot that another path entry i != j writes."""
    for b in range(src.shape[0]):
        nb = int(n[b])
        s = src[b, :nb].tolist()
        if any(s[j] != j and s[j] < nb for j in range(nb)):
            return True
    return False


SHAPES = [  # layers, batch, kv heads, max_len, head_dim, M (path length), tree nodes
    (2, 3, 2, 32, 24, 5, 9),
    (1, 5, 1, 40, 24, 8, 12),
    (3, 2, 4, 30, 40, 4, 6),
    (2, 4, 2, 48, 12, 1, 4),
    (2, 6, 3, 64, 24, 7, 16),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_matches_independent_expectation(shape):
    for seed in range(3):
        cache, base, src, n = _case(seed, *shape)
        before = cache.clone()
        want = _expected(cache, base, src, n)
        commit_kv_reference(cache, base, src, n)
        assert torch.equal(cache, want)
        _assert_untouched_outside(cache, before, base, n)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_triton_matches_reference(interpreted, shape):
    overlap_seen = False
    for seed in range(3):
        cache, base, src, n = _case(seed, *shape)
        before = cache.clone()
        ref = cache.clone()
        commit_kv_reference(ref, base, src, n)
        kv_commit.commit_kv_triton(cache, base, src, n)
        assert torch.equal(cache, ref), f"seed {seed}"
        assert torch.equal(cache, _expected(before, base, src, n))
        _assert_untouched_outside(cache, before, base, n)
        overlap_seen |= _has_overlap(src, n)
    if shape[5] > 2:
        assert overlap_seen, "the random paths should include sources that are other entries' destinations"


@pytest.mark.parametrize(
    "path, n",
    [
        ([0, 2, 3, 4], 4),  # src[j] > j and src[1], src[2] are the destinations of entries 2, 3
        ([0, 1, 3, 4], 4),  # a prefix in place, then two reads from later slots
        ([0, 1, 2, 3], 4),  # identity: nothing moves
        ([0, 5, 6, 7], 2),  # only the first n entries count
        ([0, -1, -1, -1], 1),  # the root alone
    ],
)
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_overlapping_paths(monkeypatch, impl, path, n):
    if impl == "triton":
        interpreted_commit_kernel(monkeypatch)
    fn = kv_commit.commit_kv_triton if impl == "triton" else commit_kv_reference
    g = torch.Generator().manual_seed(1)
    cache = torch.randn(2, 2, 2, 16, 24, generator=g)
    base = torch.tensor([3, 0])
    src = torch.tensor([path, [0, 1, 2, 3]])
    n_acc = torch.tensor([n, 3])
    before = cache.clone()
    fn(cache, base, src, n_acc)
    for i in range(n):
        torch.testing.assert_close(cache[:, 0, :, 3 + i], before[:, 0, :, 3 + path[i]], rtol=0, atol=0)
    assert torch.equal(cache, _expected(before, base, src, n_acc))
    _assert_untouched_outside(cache, before, base, n_acc)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_half_precision(interpreted, dtype):
    cache, base, src, n = _case(7, 2, 3, 2, 32, 24, 5, 9, dtype=dtype)
    ref = cache.clone()
    commit_kv_reference(ref, base, src, n)
    kv_commit.commit_kv_triton(cache, base, src, n)
    assert torch.equal(cache, ref)


def test_triton_non_contiguous_cache(interpreted):
    """Only head_dim has to be contiguous: a batch-major buffer seen as [layers, batch, ...]."""
    g = torch.Generator().manual_seed(3)
    storage = torch.randn(4, 2, 3, 20, 24, generator=g)  # [batch, layers, heads, slots, dim]
    cache = storage.permute(1, 0, 2, 3, 4)
    assert not cache.is_contiguous() and cache.stride(-1) == 1
    base = torch.tensor([0, 5, 2, 9])
    src = torch.tensor([[0, 2, 3], [0, 1, 4], [0, -1, -1], [0, 3, 5]])
    n = torch.tensor([3, 3, 1, 2])
    want = _expected(cache.clone(), base, src, n)
    kv_commit.commit_kv_triton(cache, base, src, n)
    assert torch.equal(cache, want)
    assert torch.equal(storage.permute(1, 0, 2, 3, 4), want)  # written through the view


def test_dispatch_uses_torch_on_cpu_without_interpret(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    called = []
    monkeypatch.setattr(kv_commit, "commit_kv_triton", lambda *a: called.append("triton"))
    cache, base, src, n = _case(0, 1, 3, 1, 20, 24, 4, 6)
    assert not kv_commit.use_triton(cache)
    want = _expected(cache, base, src, n)
    commit_kv(cache, base, src, n)
    assert called == [] and torch.equal(cache, want)


def test_dispatch_uses_triton_under_interpret(interpreted):
    cache, base, src, n = _case(0, 1, 3, 1, 20, 24, 4, 6)
    assert kv_commit.use_triton(cache)
    want = _expected(cache, base, src, n)
    commit_kv(cache, base, src, n)
    assert len(interpreted) == 1 and torch.equal(cache, want)


def test_interpret_env_set_after_import_is_honoured(monkeypatch):
    """TRITON_INTERPRET=1 set after kv_commit was imported: commit_kv dispatches CPU tensors
    to Triton, and the kernel must run in the interpreter (a kernel jitted once at import
    stayed a GPU kernel: '0 active drivers')."""
    if importlib.util.find_spec("triton") is None or kv_commit.triton is None:
        pytest.skip("triton is not installed")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cache, base, src, n = _case(0, 1, 2, 1, 20, 24, 4, 6)
    want = _expected(cache, base, src, n)
    commit_kv(cache, base, src, n)
    assert torch.equal(cache, want)


@pytest.mark.parametrize("impl", ["torch", pytest.param("triton", marks=needs_triton)])
def test_one_commit_moves_keys_and_values_of_the_rows_given(monkeypatch, impl):
    """KVCache keeps keys and values in one buffer; `layers(rows)` is both as [2 * layers, ...]
    (keys first), so one commit moves both for those rows and leaves the other rows alone."""
    from specheads.target.model import KVCache, TargetSpec

    if impl == "triton":
        interpreted_commit_kernel(monkeypatch)
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    spec = TargetSpec.__new__(TargetSpec)
    spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim = 3, 2, 8
    cache = KVCache(spec, 3, 12, torch.float32, "cpu")
    g = torch.Generator().manual_seed(0)
    cache.kv.copy_(torch.randn(cache.kv.shape, generator=g))
    before = cache.kv.clone()
    base, src, n = torch.tensor([2, 5]), torch.tensor([[0, 2, 3], [0, 1, -1]]), torch.tensor([3, 2])
    both = cache.layers(slice(0, 2))
    assert both.shape == (6, 2, 2, 12, 8) and both.data_ptr() == cache.k.data_ptr()
    commit_kv(both, base, src, n)
    for kv in (0, 1):  # keys, then values
        for r, (b0, path, m) in enumerate(zip(base.tolist(), src.tolist(), n.tolist())):
            for i in range(m):
                assert torch.equal(cache.kv[kv, :, r, :, b0 + i], before[kv, :, r, :, b0 + path[i]])
    assert torch.equal(cache.kv[:, :, 2], before[:, :, 2])  # the row not given
    view = cache.rows(slice(1, 3))
    assert view.k.data_ptr() == cache.k[:, 1].data_ptr() and torch.equal(view.v, cache.v[:, 1:3])
