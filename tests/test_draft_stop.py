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
    assert stop.walk(pos, 8, None) == (2, 7, 6)
    # below 0.05: root 0 stops after depth 2 and accepts 1 (-> 3); root 2 the same (-> 5); root 4 (-> 7);
    # root 6 (-> 8, the last token only)
    assert stop.walk(pos, 8, math.log(0.05)) == (4, 7, 8)
    # a threshold nothing falls below drafts every depth
    assert stop.walk(pos, 8, math.log(1e-9)) == stop.walk(pos, 8, None)
    # reading the first depth alone: below the threshold at depth 1 (none here at 0.05) nothing changes;
    # below 0.6, every doubtful root drafts 2 depths: root 0 accepts 1 (-> 3), root 2 (-> 5), 4 (-> 7), 6 (-> 8)
    assert stop.walk(pos, 8, math.log(0.05), first=2) == stop.walk(pos, 8, None)
    assert stop.walk(pos, 8, math.log(0.6), first=2) == (4, 7, 8)
