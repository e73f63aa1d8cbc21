"""gpu_runs/host_steps.py times the engine's host work a step with the device's work stubbed: its
methods must build (the adaptive ones with --settings added to their own) and its report count
the steps each method ran."""

import json
import sys

from tests.helpers import load_script


def test_host_steps_runs_each_method_and_reports_its_steps(tmp_path, monkeypatch):
    script = load_script("gpu_runs/host_steps.py")
    out = tmp_path / "host.json"
    monkeypatch.setattr(sys, "argv", ["host_steps.py", "--methods", "ar", "tree", "tree-adaptive-full",
                                      "tree-adaptive-hold", "assist", "assist-adaptive", "--batch", "2", "--prompts", "4",
                                      "--max-new-tokens", "8", "--repeats", "1", "--settings", "full_share=0",
                                      "--out", str(out)])
    script.main()
    rows = {r["method"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ar", "tree", "tree-adaptive-full", "tree-adaptive-hold", "assist", "assist-adaptive"}
    # (a step of the assist's tree accepts up to 15 drafts: its 8 tokens may take one step)
    assert all(r["steps"] >= (1 if name.startswith("assist") else 8 // 2) and r["ms_per_step"] > 0
               for name, r in rows.items())


def test_host_steps_times_the_launches_apart(tmp_path, monkeypatch):
    """--launches: each method's planned and unplanned launches (the first after each prefill) and the
    policy's `launched`, us a call; `ar`'s engine has no policy and still runs."""
    script = load_script("gpu_runs/host_steps.py")
    out = tmp_path / "host.json"
    monkeypatch.setattr(sys, "argv", ["host_steps.py", "--methods", "ar", "tree-adaptive", "--batch", "1",
                                      "--prompts", "3", "--max-new-tokens", "12", "--repeats", "1", "--launches",
                                      "--out", str(out)])
    script.main()
    rows = {r["method"]: r["launch_us"] for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"ar", "tree-adaptive"}
    assert rows["tree-adaptive"]["unplanned"] > 0 and rows["tree-adaptive"]["planned"] > 0
    assert rows["tree-adaptive"]["launched"] > 0 and rows["ar"]["launched"] == 0
