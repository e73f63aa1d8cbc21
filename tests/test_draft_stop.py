"""gpu_runs/draft_stop.py's walk: a step stops after the first depth whose best path falls below the
threshold, accepts what the tree drafted to that depth accepts, and counts the depths it drafted."""

import math

from tests.helpers import load_script


def test_a_step_stops_after_the_first_depth_below_the_threshold():
    stop = load_script("gpu_runs/draft_stop.py")
    # best path log-probability by depth, and the drafts accepted by a draft stopped after depth 1..3
    confident = {"best": [math.log(0.9), math.log(0.8), math.log(0.7)], "acc": [1, 2, 3]}
    doubtful = {"best": [math.log(0.5), math.log(0.01), math.log(0.001)], "acc": [1, 1, 2]}
    pos = [doubtful, confident, doubtful, confident, doubtful, doubtful, doubtful, doubtful]
    # full depth: root 0 accepts 2 (emitted 1 -> 4), root 3 accepts 3 (-> 8): 2 steps, 6 depths
    assert stop.walk(pos, 8, None) == (2, 7, 6, 0)
    # below 0.05: root 0 stops after depth 2 and accepts 1 (-> 3); root 2 the same (-> 5); root 4 (-> 7);
    # root 6 (-> 8, the last token only)
    assert stop.walk(pos, 8, math.log(0.05)) == (4, 7, 8, 0)
    # a threshold nothing falls below drafts every depth
    assert stop.walk(pos, 8, math.log(1e-9)) == stop.walk(pos, 8, None)
    # reading the first depth alone: below the threshold at depth 1 (none here at 0.05) nothing changes;
    # below 0.6, every doubtful root drafts 2 depths: root 0 accepts 1 (-> 3), root 2 (-> 5), 4 (-> 7), 6 (-> 8)
    assert stop.walk(pos, 8, math.log(0.05), first=2) == stop.walk(pos, 8, None)
    assert stop.walk(pos, 8, math.log(0.6), first=2) == (4, 7, 8, 0)


def test_a_gated_root_takes_the_lookups_chain_and_drafts_no_depth():
    stop = load_script("gpu_runs/draft_stop.py")
    doubtful = {"best": [math.log(0.5), math.log(0.01), math.log(0.001)], "acc": [1, 1, 2]}
    pos = [doubtful] * 12
    # the lookup matches at roots 3 and 6 (the gated chain accepts 2 there), nowhere else
    gated = [None, None, None, 2, None, None, 4, None, None, None, None, None]
    # full depth: root 0 accepts 2 (-> 4), root 3 gated accepts 2 (-> 7), root 6 gated accepts 4 (-> 12)
    assert stop.walk(pos, 12, None, gated=gated) == (3, 11, 3, 2)
    # below 0.05 the tree's steps stop after depth 2 and accept 1: root 0 (-> 3), 2 (-> 5), 4 (-> 7), 6 gated (-> 12)
    assert stop.walk(pos, 12, math.log(0.05), gated=gated) == (4, 11, 6, 1)


def test_matched_roots_follow_the_assists_lookup():
    stop = load_script("gpu_runs/draft_stop.py")
    prompt = [5, 6, 7, 8, 9]
    # roots: after 7 (suffix 5 6 7... only 1-2 tokens of the answer) ... after the answer's 6, 7: the suffix
    # 5? no: the 3-token suffix ending at each root, matched where it occurred before
    answer = [1, 6, 7, 8, 2, 5, 6, 7, 3]
    got = stop.matched_roots(prompt, answer)
    assert len(got) == len(answer) - 1
    # root 3 (6, 7, 8) repeats the prompt's 6 7 8 and root 7 (5, 6, 7) its 5 6 7; root 2 (1, 6, 7) matches two tokens only
    assert got == [False, False, False, True, False, False, False, True]
    # the first root is never gated, even where its suffix matched
    assert stop.matched_roots([4, 4, 4, 4], [4, 4, 1])[0] is False
