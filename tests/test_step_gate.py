"""gpu_runs/step_gate.py: a later call on the warm machine runs only where the new step paid, so
the flag must follow the steps relative to each run's own `ar` step (a cheaper `ar` in the new code
moves every method's milliseconds alike), the median over runs, the kind, tree and batch asked."""

import json

from tests.helpers import load_script


def write(path, rows):
    path.write_text(json.dumps({"rows": rows}))
    return str(path)


def rows(ar, medusa, eagle3=1.0, batch=1):
    return [{"kind": "ar", "batch": batch, "tree": "", "x_ar_step": 1.0, "ms_per_step": ar},
            {"kind": "medusa", "batch": batch, "tree": "2,8,12", "x_ar_step": medusa / ar, "ms_per_step": medusa},
            {"kind": "eagle3", "batch": batch, "tree": "2,8,12", "x_ar_step": eagle3 / ar, "ms_per_step": eagle3}]


def run(gate, monkeypatch, tmp_path, old, new, *extra):
    flag = tmp_path / "flag"
    monkeypatch.setattr("sys.argv", ["step_gate.py", "--old", *old, "--new", *new, "--flag", str(flag), *extra])
    gate.main()
    return flag.exists()


def test_the_flag_follows_the_step_relative_to_ar(tmp_path, monkeypatch):
    gate = load_script("gpu_runs/step_gate.py")
    old = [write(tmp_path / f"old{i}.json", rows(0.678, 0.820)) for i in range(2)]
    # 3.3% cheaper in ms, but ar 1.6% cheaper too: 1.7% against ar, short of 2%
    short = [write(tmp_path / f"short{i}.json", rows(0.667, 0.793)) for i in range(2)]
    assert not run(gate, monkeypatch, tmp_path, old, short)
    paid = [write(tmp_path / f"paid{i}.json", rows(0.678, 0.790)) for i in range(2)]
    assert run(gate, monkeypatch, tmp_path, old, paid)
    # the median of the runs: one fast outlier does not pay
    mixed = [write(tmp_path / "m0.json", rows(0.678, 0.700)), write(tmp_path / "m1.json", rows(0.678, 0.820)),
             write(tmp_path / "m2.json", rows(0.678, 0.821))]
    assert not run(gate, monkeypatch, tmp_path, old, mixed)
    # another kind, or a batch the runs lack, pays nothing
    assert not run(gate, monkeypatch, tmp_path, old, paid, "--kind", "eagle3")
    assert not run(gate, monkeypatch, tmp_path, old, paid, "--batch", "8")
