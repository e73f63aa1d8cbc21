"""gpu_runs/kinds_table.py (the head-kinds table of issues 23 and 24) builds its table from fake run files."""

import importlib.util
from pathlib import Path


def test_kinds_table_selfcheck(capsys):
    path = Path(__file__).resolve().parents[1] / "gpu_runs" / "kinds_table.py"
    spec = importlib.util.spec_from_file_location("kinds_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.selfcheck()
    assert "selfcheck: ok" in capsys.readouterr().out
