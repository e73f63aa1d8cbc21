"""gpu_runs/verify_width.py's rules: always the narrow verify, always the wide one, the oracle (wide only
where it accepts more) and widening where the nodes ranked past the narrow width hold enough probability;
and the walk that serves an answer with them (specheads.evaluation.estimate.walk_with)."""

from specheads.evaluation.estimate import walk_with
from tests.helpers import load_script


def test_each_rule_picks_its_width_and_the_walk_counts_wide_steps():
    vw = load_script("gpu_runs/verify_width.py")
    # drafts accepted verifying the best 2 / 4 nodes, and the pool's best 4 path probabilities
    sure = {"acc": [2, 3], "p": [0.9, 0.8, 0.5, 0.4]}  # ranks 3-4 hold 0.9
    doubt = {"acc": [0, 0], "p": [0.3, 0.1, 0.05, 0.05]}  # ranks 3-4 hold 0.1
    pos = [sure, doubt, doubt, sure, doubt, doubt, doubt, doubt, doubt, doubt]
    rules = dict(vw.rules(2, 4, [0.5]))
    assert rules["narrow"](sure) == (2, 0) and rules["wide"](sure) == (3, 1)
    assert rules["oracle"](sure) == (3, 1) and rules["oracle"](doubt) == (0, 0)
    assert rules["mass>=0.5"](sure) == (3, 1) and rules["mass>=0.5"](doubt) == (0, 0)
    # 10 tokens: narrow, root 0 accepts 2 (emitted 1 -> 4), root 3 accepts 2 (-> 7), then one a step
    assert walk_with(10, lambda i: rules["narrow"](pos[i])) == (5, 4, 0)
    # wide where sure: root 0 accepts 3 (-> 5), then roots 4.. accept nothing: 6 steps, one of them wide
    assert walk_with(10, lambda i: rules["mass>=0.5"](pos[i])) == (6, 3, 1)
    # the last step's drafts count up to the budget only
    assert walk_with(3, lambda i: rules["wide"](pos[i])) == (1, 1, 1)
