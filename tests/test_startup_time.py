"""gpu_runs/startup_time.py --count: the graphs a server's start-up captures, counted on the CPU by
batch bucket, for the method `serve` drafts with (an EAGLE-3 head: eagle3+ngram, whose gate adds the
gated chain's and the ladder's graphs in batches of one row)."""

import importlib.util
import json
import sys

from tests.helpers import load_script


def _count(tmp_path, monkeypatch, *extra):
    script = load_script("gpu_runs/startup_time.py")
    out = tmp_path / "startup"
    monkeypatch.setattr(sys, "argv", ["startup_time.py", "--count", "--layers", "1", "--max-batch", "2",
                                      "--policies", "adaptive", "--max-len", "256", "--out", str(out), *extra])
    script.main()
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    return row


def test_startup_time_counts_the_servers_graphs_and_the_ladders_share(tmp_path, monkeypatch):
    default = _count(tmp_path, monkeypatch)
    assert default["method"] == "eagle3+ngram" and default["capture_s"] >= 0
    if importlib.util.find_spec("triton"):  # the kernel variants its dry run meets (kernels/ahead.py)
        assert default["compile_ahead"]["variants"] > 50
    assert set(default["step_graphs_by_batch"]) == {"1", "2"}  # (JSON keys)
    no_ladder = _count(tmp_path, monkeypatch, "--draft-option", "ngram_gate_long=0")
    assert no_ladder["options"] == {"ngram_gate_long": 0}
    # per context bucket at batch 1: the ladder's step, the step after a gated one when it is the ladder,
    # and every step after a ladder step (plain, each tier, the gated chain, the ladder); at batch 2: the
    # plain catch-up after a ladder step
    ones, twos = (default["step_graphs_by_batch"][b] - no_ladder["step_graphs_by_batch"][b] for b in ("1", "2"))
    kvs = len(default["context_buckets"])
    assert ones == kvs * (1 + 1 + (1 + len(default["tiers"]) + 2)) and twos == kvs
    head_alone = _count(tmp_path, monkeypatch, "--method", "eagle3")
    assert head_alone["step_graphs_by_batch"]["1"] < no_ladder["step_graphs_by_batch"]["1"]
