"""The target's causal attention (Triton, through the CPU interpreter): equal to its reference,
and a token's output bits independent of where its keys sit (a tree node and the plain decode
of its path), of the other rows and tokens of the call, of the cache bucket, and of split-K."""

from __future__ import annotations

import pytest
import torch

from specheads.kernels import attention, tuning
from specheads.kernels.verify import ancestors_reference
from tests.kernels.interpret import interpret_triton, needs_triton, row_independent_dots


@pytest.fixture
def interpret(monkeypatch):
    interpret_triton(monkeypatch)
    row_independent_dots(monkeypatch)


def _tree(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random parents (each before its child) and depths of an n-node tree, node 0 the root."""
    g = torch.Generator().manual_seed(seed)
    parents, depth = [-1], [0]
    for i in range(1, n):
        p = int(torch.randint(0, i, (1,), generator=g))
        parents.append(p)
        depth.append(depth[p] + 1)
    return torch.tensor(parents), torch.tensor(depth)


def _tree_inputs(b, n, base, seed):
    parents, depth = zip(*(_tree(n, seed + i) for i in range(b)))
    parents, depth = torch.stack(parents), torch.stack(depth)
    anc = ancestors_reference(parents, int(depth.max()))
    return parents, depth, anc, base[:, None] + depth


@needs_triton
@pytest.mark.parametrize("h, kv, t, s, window, split", [
    (3, 3, 1, 40, None, None),
    (6, 2, 5, 300, None, True),  # 3 chunks of 128 keys, one program each
    (6, 2, 5, 300, None, False),  # the same chunks folded by one program
    (9, 3, 17, 200, 50, None),  # a sliding window
    (4, 1, 7, 150, None, None),  # 4 heads of one KV group: 4 tokens a program
])
def test_contiguous_equals_the_reference(interpret, h, kv, t, s, window, split):
    g = torch.Generator().manual_seed(t)
    b, d = 2, 16
    q = torch.randn(b, t, h, d, generator=g).transpose(1, 2)
    k, v = torch.randn(b, kv, s, d, generator=g), torch.randn(b, kv, s, d, generator=g)
    positions = torch.stack([torch.arange(s - t - 3, s - 3), torch.arange(10, 10 + t)])
    out = attention.causal_attention(q, k, v, positions, window, split=split)
    ref = attention.causal_attention_reference(q, k, v, positions, window)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("window", [None, 20])
def test_tree_equals_the_reference(interpret, window):
    g = torch.Generator().manual_seed(5)
    b, h, kv, n, s, d = 3, 6, 2, 11, 260, 16
    base = torch.tensor([100, 128 - 3, 200])  # a tree across a block and a chunk boundary
    _, depth, anc, positions = _tree_inputs(b, n, base, seed=1)
    q = torch.randn(b, h, n, d, generator=g)
    k, v = torch.randn(b, kv, s, d, generator=g), torch.randn(b, kv, s, d, generator=g)
    tree = (base, anc, depth)
    out = attention.causal_attention(q, k, v, positions, window, tree=tree)
    ref = attention.causal_attention_reference(q, k, v, positions, window, tree=tree)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


@needs_triton
@pytest.mark.parametrize("dtype, tree_tokens", [(torch.float32, 1), (torch.bfloat16, 1), (torch.bfloat16, 3),
                                                (torch.bfloat16, None), (torch.float32, None)])
def test_a_tree_node_matches_the_decode_of_its_path_bit_for_bit(interpret, tune, dtype, tree_tokens):
    """Each node of a tree verified at slots base + n gives the bits of its path decoded alone:
    the path committed at base..base+d, the node the one query (batch 1, its own cache), with
    one or three tree tokens a program, or all that fit (None: the tokens of a path then share
    its passes over the blocks that hold tree positions)."""
    tune(attention_tree_tokens=tree_tokens or 1, attention_tree_many_batch=1 if tree_tokens is None else 1000,
         attention_tree_one_token_programs=0)
    g = torch.Generator().manual_seed(7)
    b, h, kv, n, s, d = 2, 6, 2, 13, 300, 16
    base = torch.tensor([60, 250])  # the second tree runs past a 128-key chunk boundary
    parents, depth, anc, positions = _tree_inputs(b, n, base, seed=3)
    q = torch.randn(b, h, n, d, generator=g).to(dtype)
    k, v = torch.randn(b, kv, s, d, generator=g).to(dtype), torch.randn(b, kv, s, d, generator=g).to(dtype)
    out = attention.causal_attention(q, k, v, positions, tree=(base, anc, depth))
    for row in range(b):
        L = int(base[row])
        for node in range(n):
            path = [node]
            while parents[row, path[-1]] >= 0:
                path.append(int(parents[row, path[-1]]))
            path.reverse()
            ks = torch.randn(1, kv, s + 64, d, generator=g).to(dtype)  # other contents elsewhere
            vs = torch.randn(1, kv, s + 64, d, generator=g).to(dtype)
            ks[0, :, :L], vs[0, :, :L] = k[row, :, :L], v[row, :, :L]
            for j, p in enumerate(path):
                ks[0, :, L + j], vs[0, :, L + j] = k[row, :, L + p], v[row, :, L + p]
            pos = torch.tensor([[L + len(path) - 1]])
            lone = (torch.tensor([L + len(path) - 1]), torch.ones(1, 1, 1, dtype=torch.bool), torch.zeros(1, 1,
                    dtype=torch.long))
            for decoded in (attention.causal_attention(q[row:row + 1, :, node:node + 1], ks, vs, pos),
                            attention.causal_attention(q[row:row + 1, :, node:node + 1], ks, vs, pos, tree=lone)):
                assert torch.equal(decoded[0, :, 0], out[row, :, node]), (row, node)


def test_a_tree_call_of_few_programs_takes_one_token_a_program(tune):
    """SmolLM2's heads (9 query, 3 KV): a 16-token tree at batch 1 takes 2 tokens a program (8
    tiles, 24 programs a chunk) unless that launches at most attention_tree_one_token_programs
    programs, chunks of 128 keys counted; a decode and a batch of 64 never change."""
    tune(attention_tree_tokens=2, attention_tree_one_token_programs=64)
    assert attention.causal_tiles(9, 3, True, 1, 16, 256)[1] == 3  # 48 programs: one token
    assert attention.causal_tiles(9, 3, True, 1, 16, 257)[1] == 6  # 3 chunks, 72 programs
    assert attention.causal_tiles(9, 3, True, 2, 16, 128)[1] == 3
    assert attention.causal_tiles(9, 3, True, 8, 16, 64)[1] == 6  # 192 programs
    assert attention.causal_tiles(9, 3, True, 1)[1] == 6  # tokens and keys unknown
    assert attention.causal_tiles(9, 3, False, 1, 1, 64)[1] == 16
    tune(attention_tree_one_token_programs=0)
    assert attention.causal_tiles(9, 3, True, 1, 16, 64)[1] == 6


@needs_triton
def test_a_rows_bits_do_not_depend_on_the_call(interpret):
    """Row 0's output at batch 1 equals its output among other rows, in a longer cache bucket,
    with more tokens in the call, split or not."""
    g = torch.Generator().manual_seed(11)
    h, kv, t, s, d = 6, 2, 5, 300, 16
    q = torch.randn(4, h, t + 4, d, generator=g).bfloat16()
    k, v = torch.randn(4, kv, s + 200, d, generator=g).bfloat16(), torch.randn(4, kv, s + 200, d, generator=g).bfloat16()
    positions = torch.arange(200, 200 + t + 4).expand(4, t + 4).clone()
    alone = attention.causal_attention(q[:1, :, :t], k[:1, :, :s], v[:1, :, :s], positions[:1, :t], split=False)
    for split in (True, False):
        crowd = attention.causal_attention(q, k, v, positions, split=split)
        assert torch.equal(crowd[0, :, :t], alone[0])


@needs_triton
@pytest.mark.parametrize("window", [None, 150])
def test_a_split_program_of_several_chunks_keeps_the_bits(interpret, window):
    """Split programs summing 2, 3 or 5 neighbouring chunks each (attention_split_programs caps a
    call's programs) give the bits of one program a chunk and of one program for all of them, for
    a decode and for a tree across a chunk boundary, with rows whose keys end in different chunks."""
    g = torch.Generator().manual_seed(13)
    h, kv, s, d = 6, 2, 700, 16  # 6 chunks of 128 keys
    q = torch.randn(2, h, 1, d, generator=g).bfloat16()
    k, v = torch.randn(2, kv, s, d, generator=g).bfloat16(), torch.randn(2, kv, s, d, generator=g).bfloat16()
    positions = torch.tensor([[650], [300]])  # row 1 sees 3 of the chunks
    n, base = 9, torch.tensor([380, 250])  # trees across the chunk boundary at 384 and 256
    _, depth, anc, tree_pos = _tree_inputs(2, n, base, seed=5)
    qt = torch.randn(2, h, n, d, generator=g).bfloat16()
    cases = [(q, positions, None), (qt, tree_pos, (base, anc, depth))]
    for qq, pos, tree in cases:
        one = attention.causal_attention(qq, k, v, pos, window, tree=tree, split=True)
        assert torch.equal(attention.causal_attention(qq, k, v, pos, window, tree=tree, split=False), one)
        n_tiles = -(-qq.shape[2] * (h // kv) // attention.causal_tiles(h, kv, tree is not None, 2, qq.shape[2], s)[1])
        programs = 2 * kv * n_tiles * 6  # one a chunk
        for per in (2, 3, 5):
            with tuning.using(tuning.active().replace(attention_split_programs=-(-programs // per))):
                assert torch.equal(attention.causal_attention(qq, k, v, pos, window, tree=tree, split=True), one), per


@needs_triton
def test_the_tree_plan_kernel_equals_its_reference(interpret):
    """order sorts the nodes by (first leaf below, depth); path[n, j] is n's ancestor of depth j."""
    base = torch.tensor([40, 7, 300])
    _, depth, anc, _ = _tree_inputs(3, 13, base, seed=9)
    got = attention.tree_plan(base, anc, depth)
    want = attention.tree_plan_reference(base, anc, depth)
    for name in ("order", "leaf", "path"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    row_anc, row_depth = anc[0], depth[0]
    for place, node in enumerate(want.order[0].tolist()):
        leaf = int(want.leaf[0, place])
        assert row_anc[leaf, node] and row_anc[:, leaf].sum() == 1  # a leaf below the node
        for j in range(13):
            a = int(want.path[0, node, j])
            assert (a == -1) == (j > row_depth[node]) and (a == -1 or (row_anc[node, a] and row_depth[a] == j))
    keys = [(int(want.leaf[0, p]), int(row_depth[n])) for p, n in enumerate(want.order[0].tolist())]
    assert keys == sorted(keys)
