"""gpu_runs/trace_plot.py: a traced policy_steps.py run drawn step by step, and a clear refusal of a
file without a trace."""
import json
import sys

import pytest

from tests.helpers import load_script


def _trace(tmp_path, traced: bool):
    steps = [{"i": i, "t_ms": 1.0 + i, "rows": max(64 - 4 * max(i - 10, 0), 1), "b": 64, "tier": 3 if i < 12 else 4,
              "gated": i == 15, "tokens": 150 - i, "accepted": 80} for i in range(16)]
    cells = [{"method": "assist-adaptive", "batch": 64, "tokens_per_s": 38000.0, "tiers": {"4,1,4": 12},
              "tier_names": ["plain", "1,1,1", "2,1,2", "4,1,4", "15,4,15"], "steps": steps if traced else []}]
    path = tmp_path / "policy_steps.json"
    path.write_text(json.dumps({"card": "test", "cells": cells}))
    return path


def test_a_traced_run_is_drawn(tmp_path, monkeypatch):
    plot = load_script("gpu_runs/trace_plot.py")
    path = _trace(tmp_path, traced=True)
    cell = plot.traced(str(path), None)[0]
    assert [plot.tier_name(cell, s) for s in cell["steps"][10:16]] == ["4,1,4"] * 2 + ["15,4,15"] * 3 + ["gated chain"]
    out = tmp_path / "trace.png"
    monkeypatch.setattr(sys, "argv", ["trace_plot.py", str(path), "--out", str(out)])
    plot.main()
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_a_trace_is_refused_by_name(tmp_path):
    plot = load_script("gpu_runs/trace_plot.py")
    path = _trace(tmp_path, traced=False)
    with pytest.raises(SystemExit, match=r"policy_steps.json has no traced cell.*--trace"):
        plot.traced(str(path), None)
    with pytest.raises(SystemExit, match="of chain2"):
        plot.traced(str(_trace(tmp_path, traced=True)), ["chain2"])
