"""Draft trees: ancestor masks, chains with padding, static tree specs."""

from __future__ import annotations

import random
import re

import pytest
import torch

from specheads.runtime.tree import Tree, chain_tree, parse_static_tree
from tests.kernels.interpret import interpret_triton, needs_triton


def _tree(parents_rows, tokens_rows=None):
    parents = torch.tensor(parents_rows)
    b, n = parents.shape
    depth = torch.zeros(b, n, dtype=torch.long)
    for i in range(b):
        for j in range(1, n):
            depth[i, j] = depth[i, parents[i, j]] + 1
    tokens = torch.tensor(tokens_rows) if tokens_rows is not None else torch.arange(n).expand(b, n).clone()
    return Tree(tokens, parents, depth, torch.ones(b, n, dtype=torch.bool), int(depth.max()))


def _brute_ancestors(parents: list[int]) -> list[list[bool]]:
    n = len(parents)
    out = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j >= 0:
            out[i][j] = True
            j = parents[j]
    return out


def test_ancestors_of_a_hand_built_tree():
    #        0
    #      /   \
    #     1     2
    #     |     |
    #     3     5
    #     |
    #     4
    # row 1 of the batch: a chain 0-1-2-3-4-5 (rows of one batch have their own shapes)
    tree = _tree([[-1, 0, 0, 1, 3, 2], [-1, 0, 1, 2, 3, 4]])
    assert tree.size == 6
    assert tree.depth.tolist() == [[0, 1, 1, 2, 3, 2], [0, 1, 2, 3, 4, 5]]
    T, F = True, False
    expected_row0 = [
        [T, F, F, F, F, F],
        [T, T, F, F, F, F],
        [T, F, T, F, F, F],
        [T, T, F, T, F, F],
        [T, T, F, T, T, F],
        [T, F, T, F, F, T],
    ]
    anc = tree.ancestors()
    assert anc.dtype == torch.bool and anc.shape == (2, 6, 6)
    assert anc[0].tolist() == expected_row0
    assert torch.equal(anc[1], torch.ones(6, 6, dtype=torch.bool).tril())


def test_ancestors_of_a_root_only_tree():
    tree = _tree([[-1], [-1]], [[5], [9]])
    assert tree.ancestors().tolist() == [[[True]], [[True]]]


def test_ancestors_match_brute_force_on_random_trees():
    rng = random.Random(0)
    rows = []
    for _ in range(4):
        n = 13
        rows.append([-1] + [rng.randrange(j) for j in range(1, n)])  # parents come first
    tree = _tree(rows)
    anc = tree.ancestors()
    for b, parents in enumerate(rows):
        assert anc[b].tolist() == _brute_ancestors(parents), b


def test_chain_tree_stops_at_the_first_padding_node():
    roots = torch.tensor([7, 8, 9])
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [10, 11, 12]])
    valid = torch.tensor([[True, False, True], [True, True, True], [False, True, True]])
    tree = chain_tree(roots, drafts, valid)
    assert tree.tokens.tolist() == [[7, 1, 2, 3], [8, 4, 5, 6], [9, 10, 11, 12]]
    assert tree.parents.tolist() == [[-1, 0, 1, 2]] * 3
    assert tree.depth.tolist() == [[0, 1, 2, 3]] * 3
    # a valid node after a padding node is unreachable: the cumulative product drops it
    assert tree.valid.tolist() == [[True, True, False, False], [True, True, True, True],
                                   [True, False, False, False]]
    assert torch.equal(tree.ancestors(), torch.ones(3, 4, 4, dtype=torch.bool).tril().expand(3, 4, 4))


def test_chain_tree_with_no_drafts():
    tree = chain_tree(torch.tensor([3]), torch.zeros(1, 0, dtype=torch.long), torch.zeros(1, 0, dtype=torch.bool))
    assert tree.tokens.tolist() == [[3]] and tree.valid.tolist() == [[True]]
    assert tree.ancestors().tolist() == [[[True]]]


def test_parse_static_tree_sorts_and_deduplicates():
    expected = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert parse_static_tree("0;1;0,0;0,1;1,0;0,0,0") == expected
    assert parse_static_tree(" 0,0,0 ; 1,0;0;0, 1;1;0,0;0;") == expected  # spaces, repeats, a trailing ';'
    assert parse_static_tree([[1, 0], [0], [0, 0, 0], [1], [0, 1], [0, 0]]) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("0;1,0,0", "static tree path (1, 0, 0) has no parent path (1, 0)"),
        ("0;0,0;1,1", "static tree path (1, 1) has no parent path (1,)"),
        ([[0], [0, 1, 0]], "static tree path (0, 1, 0) has no parent path (0, 1)"),
        ("0;-1", "static tree path (-1,) must be a non-empty list of ranks >= 0"),
        ("0;0,-2", "static tree path (0, -2) must be a non-empty list of ranks >= 0"),
        ([[0], []], "static tree path () must be a non-empty list of ranks >= 0"),
        ("0;1,a", "static tree '0;1,a': expected paths of ranks"),
    ],
)
def test_parse_static_tree_errors(spec, message):
    from specheads.runtime.sampling import InvalidRequest  # a user error: the CLI exits 2 on it

    with pytest.raises(InvalidRequest, match=re.escape(message)):
        parse_static_tree(spec)


def _walk(parents, tokens, valid, y):
    """The reference: from the root, follow the first valid child whose token is y[current]."""
    path = [0]
    while True:
        cur = path[-1]
        nxt = next((i for i in range(len(tokens)) if parents[i] == cur and valid[i] and tokens[i] == y[cur]), None)
        if nxt is None:
            return path
        path.append(nxt)


@pytest.mark.parametrize("kernels", ["torch", pytest.param("triton", marks=needs_triton)])
def test_accept_path_equals_the_walk_on_random_trees(kernels, monkeypatch):
    """Random trees with repeated sibling tokens (the first one counts), children that repeat
    the root's token, invalid nodes, and targets that often agree with the drafts; the torch
    reference and the Triton kernel (interpreted)."""
    from specheads.runtime.engine import accept_path

    if kernels == "triton":
        interpret_triton(monkeypatch)
    rng = random.Random(0)
    for _ in range(300 if kernels == "torch" else 60):
        b, n, vocab = 3, rng.randint(1, 12), rng.randint(2, 4)
        parents = [[-1] + [rng.randrange(i) for i in range(1, n)] for _ in range(b)]
        tokens = [[rng.randrange(vocab) for _ in range(n)] for _ in range(b)]
        valid = [[True] + [rng.random() < 0.85 for _ in range(1, n)] for _ in range(b)]
        y = [[rng.randrange(vocab) for _ in range(n)] for _ in range(b)]
        depth = []
        for p in parents:
            d = [0] * n
            for i in range(1, n):
                d[i] = d[p[i]] + 1
            depth.append(d)
        max_depth = max(max(d) for d in depth)
        tree = Tree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depth), torch.tensor(valid), max_depth)
        path, n_acc, last, bonus = accept_path(tree, tree.ancestors().contiguous(), torch.tensor(y))
        for r in range(b):
            want = _walk(parents[r], tokens[r], valid[r], y[r])
            assert path[r, : len(want)].tolist() == want and (path[r, len(want):] == -1).all()
            assert int(n_acc[r]) == len(want) and int(last[r]) == want[-1] and int(bonus[r]) == y[r][want[-1]]


def _naive_lookup(seq, num_draft, max_ngram):
    """The definition: the continuation of the most recent earlier occurrence of the longest suffix."""
    for n in range(min(max_ngram, len(seq) - 1), 0, -1):
        for start in range(len(seq) - n - 1, -1, -1):
            if seq[start: start + n] == seq[-n:]:
                cont = []
                for i in range(num_draft):
                    j = start + n + i
                    cont.append(seq[j] if j < len(seq) else cont[j - len(seq)])
                return cont
    return []


def test_ngram_index_equals_the_naive_search_as_histories_grow():
    from specheads.drafters import DraftContext
    from specheads.drafters.ngram import NgramDrafter

    rng = random.Random(1)
    drafter = NgramDrafter(num_draft_tokens=5, max_ngram=3)
    histories = [[rng.randrange(4)] for _ in range(3)]
    for step in range(120):
        roots = torch.tensor([h[-1] for h in histories])
        tree = drafter.propose(DraftContext(len(histories), 0, roots, histories))
        for r, h in enumerate(histories):
            want = _naive_lookup(h, 5, 3)
            got = [t for t, ok in zip(tree.tokens[r, 1:].tolist(), tree.valid[r, 1:].tolist()) if ok]
            assert got == want, (step, r, h)
        for h in histories:  # grow in place, as the engine does, sometimes by several tokens
            h.extend(rng.randrange(4) for _ in range(rng.randint(1, 3)))
        if step == 60:  # a request leaves, a new one takes its row
            histories[1] = [rng.randrange(4) for _ in range(5)]
    assert len(drafter._index) == 3  # the finished request's index was dropped


@pytest.mark.parametrize("max_ngram", [1, 3])
def test_device_ngram_drafts_what_the_host_lookup_drafts(max_ngram):
    """The device lookup (method ngram) against the naive search, as rows are prefilled, grow by
    the tokens each step commits (one to several), move and restart; a shorter tier drafts the
    full chain's first tokens, and the first draft a plain step tells is the chain's first."""
    from specheads.drafters import DraftContext, PrefillBatch, StepResult
    from specheads.drafters.ngram import DeviceNgramDrafter
    from specheads.runtime.policy import TreeShape

    rng = random.Random(2)
    rows, cap, n = 4, 160, 5
    drafter = DeviceNgramDrafter(num_draft_tokens=n, max_ngram=max_ngram)
    drafter.allocate(rows, cap, torch.device("cpu"), torch.float32)
    short = drafter.tier(TreeShape(2, 1, 2))

    def prefill(start, prompts):
        w = max(map(len, prompts)) - 1
        ids = torch.tensor([p[:-1] + [0] * (w - len(p) + 1) for p in prompts])
        lens = torch.tensor([len(p) - 1 for p in prompts])
        first = torch.tensor([p[-1] for p in prompts])  # the root: the first generated token
        drafter.prefill(PrefillBatch(start, ids, lens, first, None, torch.zeros(len(prompts), w, 1)))

    histories = [[rng.randrange(4) for _ in range(rng.randint(2, 9))] for _ in range(rows)]
    prefill(0, histories)
    for step in range(60):
        roots = torch.tensor([h[-1] for h in histories])
        for d, size in ((drafter, n), (short, 2)):
            tree = d.propose(DraftContext(rows, 150, roots))
            for r, h in enumerate(histories):
                want = _naive_lookup(h, size, max_ngram)
                got = [t for t, ok in zip(tree.tokens[r, 1:].tolist(), tree.valid[r, 1:].tolist()) if ok]
                assert got == want, (step, r, h)
        first, found = short.first_draft(DraftContext(rows, 150, roots))
        for r, h in enumerate(histories):
            want = _naive_lookup(h, 1, max_ngram)
            assert bool(found[r]) == bool(want) and (not want or int(first[r]) == want[0]), (step, r, h)
        new = [[rng.randrange(4) for _ in range(rng.randint(1, 3))] for _ in range(rows)]
        acc = torch.tensor([len(t) for t in new])
        path = torch.tensor([list(range(len(t))) + [-1] * (3 - len(t)) for t in new])
        ys = torch.tensor([t + [0] * (3 - len(t)) for t in new])
        drafter.commit(StepResult(rows, None, path, acc, ys, None, torch.zeros(rows, 3, 1)))
        for h, t in zip(histories, new):
            h.extend(t)
        if step == 30:  # a request leaves: the last row moves into its place, a new one joins there
            drafter.move_row(3, 1, len(histories[3]))
            histories[1] = histories[3]
            histories[3] = [rng.randrange(4) for _ in range(6)]
            prefill(3, [histories[3]])
