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
    # `ar`: 7 steps a request after the prefill's token, 4 requests over 2 rows; a drafting method takes
    # at least one step a request and at most as many as `ar` (the stub accepts 0 to depth drafts a step)
    assert rows["ar"]["steps"] == 4 * 7 // 2
    assert all(4 // 2 <= r["steps"] <= rows["ar"]["steps"] and r["ms_per_step"] > 0 for r in rows.values())


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


def test_the_stand_in_card_queues_steps_and_counts_its_idle_time(monkeypatch):
    """Work queued while the card is busy starts when it is free; work queued later leaves the card
    idle in between (counted); an event is done once its work is; a prefill's read waits for the
    prefills queued, not for a step queued behind them."""
    script = load_script("gpu_runs/host_steps.py")
    now = [0.0]
    monkeypatch.setattr(script.time, "perf_counter", lambda: now[0])
    card = script.StandInCard(step_ms=2.0, prefill_ms=1.0)
    assert card.queue(0.002) == 0.002  # (the first launch: no idle before it)
    now[0] = 0.001
    assert card.queue(0.002) == 0.004  # queued behind the first
    now[0] = 0.007
    assert card.queue(0.001) == 0.008 and abs(card.idle_s - 0.003) < 1e-12
    assert abs(card.busy_s - 0.005) < 1e-12
    event = script.StandInCard.Event(0.008)
    assert not event.query()
    now[0] = 0.008
    assert event.query()
    card.reset()
    assert card.free is None and card.idle_s == card.busy_s == 0.0


def test_host_steps_on_the_stand_in_card_reports_its_busy_and_idle_time(tmp_path, monkeypatch):
    script = load_script("gpu_runs/host_steps.py")
    out = tmp_path / "host.json"
    monkeypatch.setattr(sys, "argv", ["host_steps.py", "--methods", "ar", "tree-adaptive", "--batch", "2",
                                      "--prompts", "5", "--max-new-tokens", "8", "--repeats", "2", "--card-ms", "0.2",
                                      "--prefill-ms", "0.1", "--out", str(out)])
    script.main()
    report = json.loads(out.read_text())
    assert report["card_ms"] == 0.2 and report["prefill_ms"] == 0.1
    for row in report["rows"]:
        # every prompt's prefill and at least one step a row's 8 tokens: the card's busy time
        assert row["card_busy_ms"] >= 5 * 0.1 + 0.2 and len(row["card_idle_ms"]) == 2
    ar = report["rows"][0]  # (the same steps in every run) the host waits for the card's last step
    assert ar["method"] == "ar" and ar["best_ms"] >= ar["card_busy_ms"]
