"""gpu_runs/policy_host.py times the adaptive policy on a fixed sequence of calls and prints a digest
of its choices, so that two commits' policies can be compared for speed with the same choices: the
module at HEAD (--old HEAD) must choose as the installed one, and the JSON must hold every batch size."""

import json
import subprocess

import pytest

from tests.helpers import REPO, load_script


def test_a_policy_loaded_from_a_commit_chooses_as_the_installed_one(tmp_path):
    try:
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    script = load_script("gpu_runs/policy_host.py")
    import specheads.runtime.policy as installed

    mine = script.load_policy(None)
    other = script.load_policy("HEAD")
    assert mine is installed and other is not installed
    for batch in (1, 32):
        a, b = script.run(mine, batch, 120), script.run(other, batch, 120)
        assert a[0] == b[0] and len(set(a[0])) > 1, batch  # (several tiers chosen)
    out = tmp_path / "host.json"
    import sys
    argv, sys.argv = sys.argv, ["policy_host.py", "--batch-sizes", "1", "8", "--steps", "40", "--repeats", "1",
                                "--out", str(out)]
    try:
        script.main()
    finally:
        sys.argv = argv
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 8] and all(sum(r["tiers"]) == 40 for r in rows)
