"""gpu_runs/sync_check.py (the serving loop's waits for the card, by call site, under torch's sync
debug mode on a GPU): every engine it names builds and serves its requests twice, and the report
counts the warnings it catches by where they came from."""

import json
import sys
import warnings

from tests.helpers import load_script


def test_sync_check_serves_each_engine_and_reports_its_waits(tmp_path, monkeypatch):
    script = load_script("gpu_runs/sync_check.py")
    out = tmp_path / "sync.json"
    monkeypatch.setattr(sys, "argv", ["sync_check.py", "--layers", "1", "--prompts", "4", "--tokens", "6",
                                      "--max-batch", "2", "--methods", "ar", "eagle3+ngram:adaptive", "ngram:fixed",
                                      "--out", str(out)])
    script.main()
    rows = json.loads(out.read_text())["rows"]
    assert [r["method"] for r in rows] == ["ar", "eagle3+ngram:adaptive", "ngram:fixed"]
    budgets = sum(p["max_new_tokens"] for _, p in script.requests(4, 6))
    assert all(r["tokens"] == budgets and r["steps"] > 0 and r["waits"] == 0 for r in rows)


def test_the_waits_are_counted_by_site():
    script = load_script("gpu_runs/sync_check.py")
    with script.Waits(cuda=False) as waits:
        for _ in range(3):
            warnings.warn("called a synchronizing CUDA operation")
    assert sum(waits.sites.values()) == 3 and len(waits.sites) == 1


def test_another_checkouts_engine_is_the_one_run(tmp_path):
    """--checkout DIR imports DIR's specheads, not this checkout's (which the script's helper module
    puts first on the path): the report names the one it ran."""
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    other = tmp_path / "old"
    shutil.copytree(root / "specheads", other / "specheads", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "sync.json"
    subprocess.run([sys.executable, str(root / "gpu_runs" / "sync_check.py"), "--checkout", str(other), "--layers", "1",
                    "--prompts", "2", "--tokens", "2", "--max-batch", "1", "--methods", "ar", "--out", str(out)],
                   check=True, capture_output=True, timeout=600)
    assert json.loads(out.read_text())["specheads"] == str(other / "specheads")
