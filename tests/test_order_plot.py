"""gpu_runs/order_plot.py: every timed run of a bench.py or policy_steps.py report in the order it ran,
and the plot; another file is refused by name."""

import json

import pytest

from tests.helpers import load_script


def test_runs_come_in_the_order_they_ran_and_are_drawn(tmp_path, capsys):
    plot = load_script("gpu_runs/order_plot.py")
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"rows": [{"method": "a", "tokens_per_s": 2.0, "tokens_per_s_runs": [1.0, 2.0, 3.0]},
                                          {"method": "b", "tokens_per_s": 4.0}]}))
    steps = tmp_path / "policy_steps.json"
    steps.write_text(json.dumps({"cells": [{"method": "x", "tokens_per_s": 5.0}, {"method": "y", "tokens_per_s": 6.0}]}))
    assert plot.runs_in_order(bench) == [("a", 1.0), ("a", 2.0), ("a", 3.0), ("b", 4.0)]
    assert plot.runs_in_order(steps) == [("x", 5.0), ("y", 6.0)]
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(SystemExit, match="other.json: neither"):
        plot.runs_in_order(other)
    import sys

    argv = sys.argv
    sys.argv = ["order_plot.py", str(bench), str(steps), "--out", str(tmp_path / "o.png")]
    try:
        plot.main()
    finally:
        sys.argv = argv
    assert (tmp_path / "o.png").stat().st_size > 1000
