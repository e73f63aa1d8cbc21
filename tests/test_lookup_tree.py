"""gpu_runs/lookup_tree.py: the lookup's matches (the largest suffix that occurred, latest first), their
continuations (repeating with the period where they reach the suffix) and a trie's accepted path."""

from tests.helpers import load_script


def test_matches_continuations_and_the_tries_longest_path():
    lt = load_script("gpu_runs/lookup_tree.py")
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    # the suffix 1 2 3 (3 tokens; 4 never occurred) ended at positions 6 and 2
    assert lt.matches(seq, 11, 4, 3) == [6, 2]
    assert lt.matches(seq, 11, 4, 4) == []
    assert lt.continuation(seq, 11, 6, 4) == [7, 5, 1, 2]
    assert lt.continuation(seq, 11, 2, 3) == [9, 1, 2]
    assert lt.continuation(seq, 2, 1, 4) == [3, 3, 3, 3]  # (a period of one)
    # the answer goes on 9 1 2 3: the latest match spells nothing, the trie of both all four
    want = [9, 1, 2, 3]
    chains = [lt.continuation(seq, 11, p, 4) for p in (6, 2)]
    assert lt.spelled(chains[0], want) == 0
    assert lt.trie_accepts(chains, 8, want) == 4
    assert lt.trie_accepts(chains, 5, want) == 1  # the budget cuts the second chain after its first token
