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
