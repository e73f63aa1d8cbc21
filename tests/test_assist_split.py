"""gpu_runs/assist_split.py's arithmetic: a split's accepted drafts per root, the walk over an answer,
and the share of the assist's steps that take the chain (the figures of its report)."""

from tests.helpers import load_script


def _pos(found, chain, tree):
    return {"found": found, "chain": chain, "tree": tree}


def test_a_split_takes_the_longer_path_where_the_lookup_matched():
    split = load_script("gpu_runs/assist_split.py")
    big = 3
    # accepted drafts of the head's first 0..3 nodes; the chain's drafts where the lookup matched
    pos = [_pos(True, 3, [0, 1, 1, 2]), _pos(False, 0, [0, 1, 2, 2]), _pos(True, 1, [0, 0, 2, 2])]
    assert split.accepted(pos, 3, big) == [3, 2, 1]  # the assist as it is: the chain alone where it matched
    assert split.accepted(pos, 0, big) == [2, 2, 2]  # the head's tree alone
    assert split.accepted(pos, 1, big) == [1, 2, 2]  # chain[:1] beside the head's first 2 nodes
    # an answer of 6 tokens: the prefill's, then steps rooted after tokens 1, ...
    walk_pos = [_pos(True, 3, [0, 0, 0, 0]), _pos(False, 0, [0, 0, 0, 0]), _pos(False, 0, [0, 0, 0, 0]),
                _pos(False, 0, [0, 0, 0, 0]), _pos(False, 0, [0, 1, 1, 1])]
    # the first step takes the chain (3 drafts and the bonus: 5 tokens out); the last one's draft would
    # pass the answer's end, so it counts the bonus alone
    assert split.chain_steps(walk_pos, 6, big) == (2, 1)
    report = split.summarize([walk_pos, walk_pos], ["coding", "writing"], [6, 6], big)
    assert report["chain_step_share"] == {"all": 0.5, "coding": 0.5, "chat": 0.5}
    assert report["splits"][3]["all"] == 2.5 and report["splits"][0]["all"] == 1.0
    assert report["matched_roots"] == 0.2


def test_the_gated_long_chain_takes_the_whole_chain_or_a_narrower_tree(tmp_path):
    """long_chain[m]: the whole chain where the lookup matched, the head's first m nodes elsewhere;
    --positions summarizes a saved replay again without a model."""
    import gzip
    import json

    split = load_script("gpu_runs/assist_split.py")
    big = 3
    pos = [_pos(True, 3, [0, 0, 0, 0]), _pos(False, 0, [0, 1, 1, 2]), _pos(False, 0, [0, 1, 1, 2]),
           _pos(False, 0, [0, 1, 2, 2]), _pos(False, 0, [0, 1, 2, 2]), _pos(False, 0, [0, 1, 2, 2])]
    report = split.summarize([pos], ["coding"], [7], big)
    # m = 1: 3 drafts + bonus (4 tokens, 5 out), then 1 + bonus: 7 out in 2 steps
    assert report["long_chain"][1]["all"] == 3.0
    assert report["long_chain"][3]["all"] == report["splits"][3]["all"] == 3.0
    saved = tmp_path / "p_positions.json.gz"
    with gzip.open(saved, "wt") as f:
        json.dump({"categories": ["coding"], "new_tokens": [7], "positions": [pos]}, f)
    assert split.main(["--positions", str(saved), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert again["long_chain"]["1"]["all"] == 3.0 and again["splits"]["3"]["all"] == report["splits"][3]["all"]


def test_longer_gated_chains_walk_the_lookups_chain_up_to_each_length():
    """--chains: a root whose lookup matched takes the lookup alone's accepted drafts cut at C, another
    the head's tree of the positions file; a lookup replay of other answers is refused."""
    import pytest

    split = load_script("gpu_runs/assist_split.py")
    pos = [_pos(True, 3, [0, 0, 0, 0]), _pos(False, 0, [0, 1, 1, 2]), _pos(False, 0, [0, 1, 1, 2]),
           _pos(False, 0, [0, 1, 1, 2]), _pos(False, 0, [0, 1, 1, 2]), _pos(False, 0, [0, 1, 1, 2])]
    # the lookup matched at the first root and spells 5 of the answer's next tokens (the positions cut it at 3)
    chains = [[(True, 5)] + [(False, 0)] * 5]
    got = split.chain_walks([pos], chains, ["coding"], [7], [1, 3, 5], nodes=3)
    # (7 tokens: the prefill's, then a step rooted after each token the steps before emitted)
    assert got[5]["coding"] == split.mean_length([[5, 2, 2, 2, 2, 2]], [7])
    assert got[3]["coding"] == split.mean_length([[3, 2, 2, 2, 2, 2]], [7])
    assert got[5]["coding"] > got[3]["coding"] > got[1]["coding"]
    with pytest.raises(AssertionError, match="another replay's positions"):
        split.chain_walks([pos], [[(False, 0)] * 6], ["coding"], [7], [3], nodes=3)


def test_the_lookup_alone_finds_the_assists_chain():
    """lookup_chains (no head) matches where the assist's replay (`positions`) matched and accepts as
    many of the chain's drafts, up to the assist's N; past N it goes on."""
    import torch

    from specheads.evaluation.estimate import scoring_drafter
    from tests.runtime.spec_helpers import make_target, random_head

    split = load_script("gpu_runs/assist_split.py")
    target = make_target(seed=0, vocab=64)
    prompt = [5, 9, 11, 3, 7, 5, 9, 11, 3, 7, 2]
    answer = [5, 9, 11, 3, 7, 5, 9, 11, 3, 7, 5, 9, 11, 3, 1, 4, 5, 9, 11, 3]
    n = 4
    drafter = scoring_drafter(target, random_head(target), "eagle3+ngram", {"num_steps": 2, "topk": 2,
                              "num_draft_tokens": n}, [prompt], [answer])
    with torch.no_grad():
        pos = split.positions(drafter, target, prompt + answer, len(prompt))
    chains = split.lookup_chains(target, [prompt], [answer], 3 * n, 4, 3)[0]
    assert [p["found"] for p in pos] == [f for f, _ in chains] and any(f for f, _ in chains)
    assert [p["chain"] for p in pos] == [min(k, n) if f else 0 for f, k in chains]
    assert max(k for _, k in chains) > n


def test_the_chain_replay_counts_the_gated_steps():
    """--chains also reports how many steps each chain length takes and the share of them on the chain:
    a long chain takes fewer steps, and the walk's steps are the ones mean_length divides by."""
    split = load_script("gpu_runs/assist_split.py")
    pos = [_pos(True, 3, [0, 0, 0, 0])] + [_pos(False, 0, [0, 1, 1, 2])] * 5
    chains = [[(True, 5)] + [(False, 0)] * 5]
    got = split.chain_step_shares([pos], chains, ["coding"], [7], [1, 5], nodes=3)
    # C=5: a gated step of 5 drafts (6 tokens) ends the 7-token answer; C=1: 2 tokens, then 2 tree steps of 3
    assert got[5]["coding"] == {"steps": 1, "gated_share": 1.0}
    assert got[1]["coding"] == {"steps": 3, "gated_share": 1 / 3}
    assert got[1]["all"] == got[1]["coding"] and "chat" not in got[1]
