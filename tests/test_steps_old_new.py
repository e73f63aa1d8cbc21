"""gpu_runs/steps_old_new.sh: the older checkout's policy_steps.py and this one's, each with its own
specheads on the path, into LABEL_old and LABEL_new; ROUNDS=N alternates which side runs first."""

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAKE = """import os, sys
out = sys.argv[sys.argv.index("--out") + 1]
print(f"b1  run 0: {SIDE} {out} {os.environ['PYTHONPATH'].split(':')[-1]}")
"""


def _checkout(folder: Path, side: str) -> None:
    (folder / "gpu_runs").mkdir(parents=True)
    (folder / "gpu_runs" / "policy_steps.py").write_text(f"SIDE = {side!r}\n" + FAKE)
    (folder / "gpu_runs" / "env.sh").write_text("")


def _run(repo: Path, out: Path, rounds: str | None) -> list[str]:
    env = {**os.environ, "OUT": str(out)}
    env.pop("ROUNDS", None)
    if rounds:
        env["ROUNDS"] = rounds
    done = subprocess.run(["bash", "gpu_runs/steps_old_new.sh", ".dev/old", "L", "--set", "chat"], cwd=repo, env=env,
                          capture_output=True, text=True, check=True, timeout=60)
    return [line.split()[3:] for line in done.stdout.splitlines() if "run 0:" in line]


def test_each_side_runs_its_own_checkout_and_rounds_alternate(tmp_path):
    repo = tmp_path / "repo"
    _checkout(repo, "new")
    _checkout(repo / ".dev" / "old", "old")
    shutil.copy(ROOT / "gpu_runs" / "steps_old_new.sh", repo / "gpu_runs")
    out = tmp_path / "out"
    assert _run(repo, out, None) == [["old", f"{out}/L_old", str(repo / ".dev/old")],
                                     ["new", f"{out}/L_new", str(repo)]]
    assert [side[:2] for side in _run(repo, out, "2")] == [["old", f"{out}/L_old_r1"], ["new", f"{out}/L_new_r1"],
                                                           ["new", f"{out}/L_new_r2"], ["old", f"{out}/L_old_r2"]]
