"""gpu_runs/kinds_table.py (the head-kinds table of issues 23 and 24) builds its table from fake run files."""

import importlib.util
from pathlib import Path

import pytest


def test_kinds_table_selfcheck(capsys):
    path = Path(__file__).resolve().parents[1] / "gpu_runs" / "kinds_table.py"
    spec = importlib.util.spec_from_file_location("kinds_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.selfcheck()
    assert "selfcheck: ok" in capsys.readouterr().out


def test_code_hash_of_a_folder_equals_that_of_its_commit(tmp_path):
    """gpu_runs/code_hash.py: the hash the pipeline records on the device (of the carried folder)
    is the one computed here from the commit, so a table names the code that ran."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("code_hash", root / "gpu_runs" / "code_hash.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    subprocess.run(f"git -C {root} archive HEAD specheads | tar -x -C {tmp_path}", shell=True, check=True)
    folder = mod.folder_hash(tmp_path / "specheads")
    assert folder == mod.commit_hash("HEAD", repo=str(root)) and len(folder) == 12
    (tmp_path / "specheads" / "extra.py").write_text("x = 1\n")
    assert mod.folder_hash(tmp_path / "specheads") != folder
