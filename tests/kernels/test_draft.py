"""The draft-loop kernels (Triton, through the CPU interpreter) against their torch
references: the head's fused input, and the frontier expansion (chunked log-softmax top-k,
the candidate pool, the next frontier and its mask rows)."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels import draft, fused
from tests.kernels.interpret import interpret_triton, needs_triton


@pytest.fixture
def interpret(monkeypatch):
    interpret_triton(monkeypatch)


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_rows", [False, True])
def test_head_input_kernel_equals_reference(interpret, dtype, with_rows):
    g = torch.Generator().manual_seed(0)
    b, t, h, vocab = 2, 3, 40, 50
    table = torch.randn(vocab, h, generator=g).to(dtype)
    tokens = torch.randint(0, vocab, (b, t), generator=g)
    if with_rows:  # a frontier: each node reads its parent's row of a wider output
        hidden = torch.randn(b, 4, h + 8, generator=g).to(dtype)[..., :h]  # row stride h + 8
        rows = torch.tensor([[3, 0, 3], [1, 2, 0]])
    else:
        hidden, rows = torch.randn(b, 1, h, generator=g).to(dtype).expand(b, t, h), None  # broadcast
    w_e, w_h = torch.randn(h, generator=g).to(dtype), torch.randn(h, generator=g).to(dtype)
    x, hid = draft.head_input(tokens, table, hidden, rows, w_e, 1e-5, w_h, 1e-6)
    ref_x, ref_hid = draft.head_input_reference(tokens, table, hidden, rows, w_e, 1e-5, w_h, 1e-6)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=4e-2)  # 1 bf16 ulp
    torch.testing.assert_close(x, ref_x, **tol)
    assert torch.equal(hid, ref_hid)
    # the same arithmetic as the rmsnorm kernel the separate norms ran on
    emb = table[tokens]
    assert torch.equal(x, torch.cat([fused.rmsnorm(emb, w_e, 1e-5)[0], fused.rmsnorm(ref_hid, w_h, 1e-6)[0]], -1))
    assert x.shape == (b, t, 2 * h)


def _expand_case(b, n, k, vocab, seed, ctx=5, width=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(b, n, vocab, generator=g) * 3
    front_score = -torch.rand(b, n, generator=g) * 4
    front_pool = torch.randint(0, 50, (b, n), generator=g)
    target_ids = torch.randperm(vocab * 2, generator=g)[:vocab]
    span = ctx + width + k + 3
    mask_src = torch.rand(b, k, span, generator=g) < 0.5
    mask_dst = torch.rand(b, k, span, generator=g) < 0.5
    return logits, front_score, front_pool, target_ids, mask_src, mask_dst


def _run(fn, case, k, off, ctx, width, with_mask):
    logits, front_score, front_pool, target_ids, mask_src, mask_dst = case
    b, n = front_score.shape
    pools = [torch.full((b, off + n * k + 2), -7, dtype=dt) for dt in (torch.long, torch.float32, torch.long)]
    dst = mask_dst.clone() if with_mask else None
    views = [p[:, off: off + n * k] for p in pools]  # a slice of a wider pool: row stride != n * k
    out = fn(logits, front_score, front_pool, k, target_ids, *views, off,
             mask_src if with_mask else None, dst if with_mask else None, ctx, width)
    return out, pools, dst


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_head_input_without_norms_is_the_plain_concatenation(interpret, dtype):
    """EAGLE-1's fc input: [embedding (in the hidden's dtype); the parent's row], copied exactly."""
    g = torch.Generator().manual_seed(1)
    b, h, vocab = 2, 40, 50
    table = torch.randn(vocab, h, generator=g).to(dtype)  # the target's embedding, in the head's dtype
    tokens = torch.randint(0, vocab, (b, 3), generator=g)
    hidden = torch.randn(b, 4, h + 8, generator=g).to(dtype)[..., :h]
    rows = torch.tensor([[3, 0, 3], [1, 2, 0]])
    x, hid = draft.head_input(tokens, table, hidden, rows, None, None, None, None)
    want = hidden.gather(1, rows[:, :, None].expand(-1, -1, h))
    assert torch.equal(hid, want)
    assert torch.equal(x, torch.cat([table[tokens], want], -1))
    assert torch.equal(x, draft.head_input_reference(tokens, table, hidden, rows, None, None, None, None)[0])


@needs_triton
@pytest.mark.parametrize("b, n, k, vocab, block, width", [
    (1, 1, 4, 300, 64, 0),  # the root's children: one node, 5 chunks, first mask rows
    (2, 4, 4, 300, 64, 8),  # a deeper depth: 4 nodes x 4 children, ancestors copied
    (2, 3, 3, 200, 2048, 6),  # one chunk; 3 nodes, 3 children
    (3, 8, 8, 500, 128, 16),  # the default tree's width
])
def test_topk_expand_kernel_equals_reference(interpret, monkeypatch, b, n, k, vocab, block, width):
    monkeypatch.setattr(draft, "BLOCK_V", block)
    case = _expand_case(b, n, k, vocab, seed=b * 100 + n + vocab, width=width)
    ctx, off = 5, 7
    got, pools, mask = _run(draft.topk_expand, case, k, off, ctx, width, with_mask=True)
    want, ref_pools, ref_mask = _run(draft.topk_expand_reference, case, k, off, ctx, width, with_mask=True)
    for name, x, y in zip(("tokens", "scores", "parents", "pool index"), got, want):
        if x.dtype == torch.float32:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)
        else:
            assert torch.equal(x, y), name
    assert torch.equal(pools[0], ref_pools[0]) and torch.equal(pools[2], ref_pools[2])
    torch.testing.assert_close(pools[1], ref_pools[1], rtol=1e-5, atol=1e-5)
    assert (pools[0][:, :off] == -7).all() and (pools[0][:, off + n * k:] == -7).all()  # nothing outside
    assert torch.equal(mask, ref_mask)
    # the scores are cumulative log-probabilities: a node's children add to its own score
    logp = torch.log_softmax(case[0], -1).topk(k, -1).values
    torch.testing.assert_close(pools[1][:, off: off + n * k], (case[1][:, :, None] + logp).reshape(b, -1),
                               rtol=1e-5, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("shared", [False, True])
def test_topk_expand_block_from_the_kernel_tuning(interpret, monkeypatch, shared):
    """speed.draft_block sets the vocabulary entries a first-stage program reads (0: BLOCK_V):
    a block of 64 over 300 entries (5 chunks) gives what the module's block of 64 does, and a
    different chunking than 2048's (one chunk) picks the same tokens."""
    from specheads.kernels import tuning

    b, n, k, vocab = 2, 4, 4, 300
    case = _expand_case(b, n, k, vocab, seed=11)
    if shared:
        case = (case[0][:, :1].contiguous(),) + case[1:]
    fn = (lambda *a: draft.topk_expand(*a, shared=True)) if shared else draft.topk_expand
    run = lambda: _run(fn, case, k, 3, 0, 0, with_mask=False)  # noqa: E731
    chunks = []  # the first-stage grid of each launch
    real = draft._kernel
    def spy(f):
        kernel = real(f)
        class Grid:
            def __getitem__(self, grid):
                chunks.append(grid[1])
                return kernel[grid]
        return Grid()
    monkeypatch.setattr(draft, "_kernel", spy)
    monkeypatch.setattr(draft, "BLOCK_V", 64)
    by_module, _, _ = run()
    monkeypatch.setattr(draft, "BLOCK_V", 2048)
    one_chunk, _, _ = run()
    with tuning.using(tuning.active().replace(draft_block=64)):
        by_tuning, _, _ = run()
    assert chunks == [5, 1, 5]
    for x, y, z in zip(by_tuning, by_module, one_chunk):
        assert torch.equal(x, y)
        if x.dtype == torch.float32:
            torch.testing.assert_close(x, z, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(x, z)


@needs_triton
@pytest.mark.parametrize("b, n, k, vocab, block", [(1, 1, 4, 300, 64), (2, 8, 8, 500, 128), (3, 4, 3, 200, 2048)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_expand_shared_logits_equal_the_expanded(interpret, monkeypatch, b, n, k, vocab, block, dtype):
    """shared=True (Medusa: every frontier node of a row has the row's logits [B, 1, V]) writes
    the pool and picks the frontier exactly as the logits expanded to [B, N, V] do (stage 1 once
    a row instead of once a node), also off the kernel."""
    monkeypatch.setattr(draft, "BLOCK_V", block)
    logits, front_score, front_pool, target_ids, _, _ = _expand_case(b, n, k, vocab, seed=b + n + vocab)
    row = logits[:, :1].to(dtype)
    case = (row.expand(b, n, vocab).contiguous(), front_score, front_pool, target_ids, None, None)
    want, want_pools, _ = _run(draft.topk_expand, case, k, 3, 0, 0, with_mask=False)
    shared = lambda *a: draft.topk_expand(*a, shared=True)  # noqa: E731
    for kernels in (True, False):
        if not kernels:
            monkeypatch.delenv("TRITON_INTERPRET")
        got, pools, _ = _run(shared, (row,) + case[1:], k, 3, 0, 0, with_mask=False)
        for x, y in zip(list(got) + pools, list(want) + want_pools):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
            if x.dtype != torch.float32:
                assert torch.equal(x, y)
    if n > 1:  # logits already a row a node
        with pytest.raises(ValueError, match="shared logits are one row"):
            draft.topk_expand(case[0], case[1], case[2], k, case[3], *want_pools, 3, shared=True)


@needs_triton
def test_topk_expand_kernel_without_mask_and_ties(interpret, monkeypatch):
    """Equal logits everywhere: the lowest draft ids win, and among equal scores the earlier
    child (node 0's) is chosen; no mask buffers (the last depth)."""
    monkeypatch.setattr(draft, "BLOCK_V", 64)
    b, n, k, vocab = 1, 2, 3, 150
    logits = torch.zeros(b, n, vocab)
    case = (logits, torch.zeros(b, n), torch.tensor([[4, 9]]), torch.arange(vocab) + 1000, None, None)
    (tok, score, parent, pool), pools, _ = _run(draft.topk_expand, case, k, 0, 0, 0, with_mask=False)
    assert pools[0].tolist()[0][:6] == [1000, 1001, 1002, 1000, 1001, 1002]
    assert pools[2].tolist()[0][:6] == [4, 4, 4, 9, 9, 9]
    assert tok.tolist() == [[1000, 1001, 1002]] and parent.tolist() == [[0, 0, 0]] and pool.tolist() == [[0, 1, 2]]
    torch.testing.assert_close(score, torch.full((1, 3), -torch.log(torch.tensor(150.0)).item()))


@needs_triton
@pytest.mark.parametrize("kernels", [True, False])
def test_topk_expand_writes_the_frontier_into_the_next_inputs(monkeypatch, kernels):
    """tok_out / parent_out: the new frontier's tokens and parents (plus parent_base) land in
    the last columns of the next call's token and row buffers, the rest of them untouched."""
    if kernels:
        interpret_triton(monkeypatch)
        monkeypatch.setattr(draft, "BLOCK_V", 64)
    b, n, k, vocab, w, base = 2, 3, 3, 200, 6, 5
    case = _expand_case(b, n, k, vocab, seed=4)
    want, want_pools, _ = _run(draft.topk_expand_reference, case, k, 0, 0, 0, with_mask=False)
    tokens = torch.full((b, w + k), -3, dtype=torch.long)
    rows = torch.full((b, w + k), -4, dtype=torch.long)
    logits, front_score, front_pool, target_ids = case[:4]
    pools = [torch.full((b, n * k), -7, dtype=dt) for dt in (torch.long, torch.float32, torch.long)]
    got = draft.topk_expand(logits, front_score, front_pool, k, target_ids, *pools, 0, None, None, 0, 0,
                            tok_out=tokens[:, w:], parent_out=rows[:, w:], parent_base=base)
    assert torch.equal(tokens[:, w:], want[0]) and torch.equal(rows[:, w:], want[2] + base)
    assert (tokens[:, :w] == -3).all() and (rows[:, :w] == -4).all()
    assert got[0].data_ptr() == tokens[:, w:].data_ptr() and torch.equal(got[3], want[3])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(pools[0], want_pools[0][:, :n * k]) and torch.equal(pools[2], want_pools[2][:, :n * k])
    with pytest.raises(ValueError, match="go together"):
        draft.topk_expand(logits, front_score, front_pool, k, target_ids, *pools, 0, tok_out=tokens[:, w:])


def test_topk_expand_rejects_k_above_the_vocab():
    with pytest.raises(ValueError, match="topk 9 exceeds the draft vocabulary"):
        draft.topk_expand(torch.zeros(1, 1, 8), torch.zeros(1, 1), torch.zeros(1, 1, dtype=torch.long), 9,
                          torch.arange(8), *[torch.zeros(1, 9)] * 3, 0)


def _pool(b, k, steps, seed, ties=False):
    """A candidate pool as the drafter builds it: k root children, then k * k children of the
    k best nodes of the depth before; a child scores at most its parent (equal with ties)."""
    g = torch.Generator().manual_seed(seed)
    score = [-torch.rand(b, k, generator=g).sort(-1, descending=True).values]
    parent, depth = [torch.full((b, k), -1)], [torch.ones(b, k, dtype=torch.long)]
    front_pool, front_score, off = torch.arange(k).expand(b, k), score[0], k
    for d in range(2, steps + 1):
        drop = torch.rand(b, k, k, generator=g)
        if ties:
            drop = torch.where(drop < 0.3, 0.0, drop)
        s = (front_score[:, :, None] - drop).reshape(b, k * k)
        score.append(s)
        parent.append(front_pool[:, :, None].expand(b, k, k).reshape(b, k * k))
        depth.append(torch.full((b, k * k), d))
        best = s.topk(k, -1).indices
        front_pool, front_score, off = off + best, s.gather(1, best), off + k * k
    tok = torch.randint(0, 1000, (b, off), generator=g)
    return tok, torch.cat(score, 1), torch.cat(parent, 1), torch.cat(depth, 1)


@needs_triton
@pytest.mark.parametrize("b, k, steps, n, ties", [(1, 2, 1, 2, False), (2, 4, 3, 10, False), (3, 8, 6, 32, False),
                                                  (2, 3, 4, 12, True)])
def test_select_tree_kernel_equals_reference(interpret, b, k, steps, n, ties):
    tok, score, parent, depth = _pool(b, k, steps, seed=k * 10 + steps, ties=ties)
    roots = torch.arange(b) + 5000
    got = draft.select_tree(roots, tok, score, parent, depth, n)
    want = draft.select_tree_reference(roots, tok, score, parent, depth, n)
    for name, x, y in zip(("tokens", "parents", "depths", "ranks"), got, want):
        assert torch.equal(x, y), name
    tokens, parents, depths, ranks = got
    assert (tokens[:, 0] == roots).all() and (parents[:, 0] == -1).all()
    # a tree in parent-first order: every parent is an earlier node one level up
    idx = torch.arange(1, n + 1)
    assert (parents[:, 1:] < idx).all() and (parents[:, 1:] >= 0).all()
    assert torch.equal(depths[:, 1:], depths.gather(1, parents[:, 1:]) + 1)
    assert sorted(ranks[0].tolist()) == list(range(n + 1))


def test_select_tree_ranks_follow_the_scores():
    """rank[i] is node i's place by score (1 = best): the nodes of rank <= m are the m best, a
    tree (what a request's smaller num_draft_tokens keeps)."""
    tok, score, parent, depth = _pool(2, 4, 3, seed=9)
    tokens, parents, depths, ranks = draft.select_tree_reference(torch.zeros(2, dtype=torch.long), tok, score,
                                                                 parent, depth, 10)
    chosen_scores = torch.cat([torch.zeros(2, 1), score.sort(-1, descending=True).values[:, :10]], 1)
    for row in range(2):
        for m in range(1, 11):
            keep = ranks[row] <= m
            assert keep[parents[row].clamp(min=0)][keep].all()  # every kept node's parent is kept
        by_rank = chosen_scores[row, ranks[row]]
        node_scores = torch.sort(by_rank[1:], descending=True).values
        torch.testing.assert_close(node_scores, chosen_scores[row, 1:])


@needs_triton
@pytest.mark.parametrize("b, n, k, dtype", [(1, 1, 4, torch.float32), (2, 4, 4, torch.float32), (1, 8, 8, torch.bfloat16),
                                             (2, 3, 3, torch.float32)])
def test_topk_expand_makes_the_next_depth_input(interpret, monkeypatch, b, n, k, dtype):
    """With next_input the launch also writes the new frontier's layer input, as head_input makes
    it from the frontier's tokens over its parents' rows of the hidden states."""
    monkeypatch.setattr(draft, "BLOCK_V", 64)
    case = _expand_case(b, n, k, 300, seed=b + n + k, width=4)
    g = torch.Generator().manual_seed(7)
    h = 24
    emb = torch.randn(2 * 300, h, generator=g).to(dtype)  # indexed by target ids (< 600)
    hidden = torch.randn(b, n, h, generator=g).to(dtype)
    w_e, w_h = torch.rand(h, generator=g).to(dtype) + 0.5, torch.rand(h, generator=g).to(dtype) + 0.5
    spec = (emb, hidden, w_e, 1e-5, w_h, 1e-6)
    plain, pools, mask = _run(draft.topk_expand, case, k, 3, 5, 4, with_mask=True)
    logits, front_score, front_pool, target_ids, mask_src, mask_dst = case
    pools2 = [torch.full_like(p, -7) for p in pools]
    dst = mask_dst.clone()
    out = draft.topk_expand(logits, front_score, front_pool, k, target_ids, *[p[:, 3: 3 + n * k] for p in pools2], 3,
                            mask_src, dst, 5, 4, next_input=spec)
    for x, y in zip(out[:4] + tuple(pools2) + (dst,), plain + tuple(pools) + (mask,)):
        assert torch.equal(x, y)
    x, hid = out[4:]
    want_x, want_hid = draft.head_input_reference(out[0], emb, hidden, out[2], w_e, 1e-5, w_h, 1e-6)
    assert torch.equal(hid, want_hid)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(x, want_x, rtol=tol, atol=tol)


@needs_triton
@pytest.mark.parametrize("b, width, kv, k, steps, with_masks", [(1, 7, 128, 4, 6, True), (3, 8, 300, 3, 7, True),
                                                                 (2, 5, 64, 1, 1, False), (2, 2, 2000, 10, 2, True)])
def test_feed_inputs_kernel_equals_reference(interpret, b, width, kv, k, steps, with_masks):
    """A step's start in one launch: the feed's positions and causal mask, committed advanced by
    the pending count (in place), the last entry, the depths' positions and the frontier's
    first mask rows (both buffers; nothing past the given view is touched)."""
    g = torch.Generator().manual_seed(b * 100 + kv)
    committed = torch.randint(0, kv - width, (b,), generator=g)
    count = torch.randint(0, width + 1, (b,), generator=g)
    w = kv + (steps - 1) * k
    runs = []
    for fn in (draft.feed_inputs, draft.feed_inputs_reference):
        c = committed.clone()
        full = torch.ones(2, b + 1, k + 1, w + 5, dtype=torch.bool)  # a view of a larger buffer, as the drafter's
        masks = full[:, :b, :k, :w] if with_masks else None
        out = fn(c, count, width, kv, masks, steps)
        runs.append((c, full, *out))
    for name, x, y in zip(("committed", "masks", "positions", "mask", "last", "depth positions"), *runs):
        assert x.dtype == y.dtype and torch.equal(x, y), name
    assert torch.equal(runs[0][0], committed + count)
    if with_masks:
        assert runs[0][1][:, b:].all() and runs[0][1][:, :, k:].all() and runs[0][1][..., w:].all()


@needs_triton
@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_topk_expand_reads_the_fed_node_in_place(monkeypatch, kernels):
    """node_rows: the root's frontier is row node_rows[b] of the feed's logits [B, W, V] and of its
    hidden states; the same results as gathering those rows first."""
    if kernels == "triton":
        interpret_triton(monkeypatch)
    monkeypatch.setattr(draft, "BLOCK_V", 64)
    b, w, k, vocab, h = 3, 5, 4, 300, 24
    case = _expand_case(b, 1, k, vocab, seed=11, width=0)
    _, front_score, front_pool, target_ids, mask_src, mask_dst = case
    g = torch.Generator().manual_seed(12)
    logits = torch.randn(b, w, vocab, generator=g) * 3
    hidden = torch.randn(b, w, h, generator=g)
    emb = torch.randn(2 * vocab, h, generator=g)
    w_e, w_h = torch.rand(h, generator=g) + 0.5, torch.rand(h, generator=g) + 0.5
    node = torch.tensor([4, 0, 2])
    results = []
    for rows in (node, None):
        lg, hid = (logits, hidden) if rows is not None else (logits[torch.arange(b), node][:, None],
                                                             hidden[torch.arange(b), node][:, None])
        pools = [torch.full((b, k), -7, dtype=dt) for dt in (torch.long, torch.float32, torch.long)]
        dst = mask_dst.clone()
        out = draft.topk_expand(lg, front_score, front_pool, k, target_ids, *pools, 0, dst, dst, 5, 0,
                                next_input=(emb, hid, w_e, 1e-5, w_h, 1e-6), node_rows=rows)
        results.append((*out, *pools, dst))
    for x, y in zip(*results):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
