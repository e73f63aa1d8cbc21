"""gpu_runs/kinds_table.py (the head-kinds table of issues 23 and 24) builds its table from fake run files."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


def test_kinds_table_selfcheck(capsys):
    load_script("gpu_runs/kinds_table.py").selfcheck()
    assert "selfcheck: ok" in capsys.readouterr().out


def test_held_out_check_finds_conversations_a_run_trained_on(tmp_path, tiny_target_dir):
    """`held-out-check`: 0 for a mix that draws the shared data (it holds out what its source holds
    out), and the count, exit 1, for data split otherwise (here a smaller eval fraction)."""
    import json
    import subprocess
    import sys

    from specheads.data.prepare import PrepareOptions, prepare
    from tests.helpers import DRAFT_VOCAB, messages_rows

    src = tmp_path / "src.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in messages_rows(40, seed=3)))
    common = dict(target=str(tiny_target_dir), max_length=128, draft_vocab_size=DRAFT_VOCAB)
    prepare(PrepareOptions(data=str(src), output=str(tmp_path / "shared"), eval_fraction=0.3, **common))
    prepare(PrepareOptions(sources=[{"name": "jsonl", "path": str(src), "ratio": 1},
                                    {"name": "jsonl", "path": str(src), "ratio": 1}],
                           output=str(tmp_path / "mix"), eval_fraction=0.3, **common))
    prepare(PrepareOptions(data=str(src), output=str(tmp_path / "other"), eval_fraction=0.05, **common))
    tool = Path(__file__).resolve().parents[1] / "gpu_runs" / "kinds_table.py"

    def check(run_data):
        done = subprocess.run([sys.executable, str(tool), "held-out-check", str(tmp_path / "shared"), str(run_data)],
                              capture_output=True, text=True)
        return done.returncode, json.loads(done.stdout)

    rc, got = check(tmp_path / "mix")
    assert rc == 0 and got["in_run_train"] == 0 and got["shared_heldout"] > 0, got
    rc, got = check(tmp_path / "other")
    assert rc == 1 and 0 < got["in_run_train"] <= got["shared_heldout"], got


def test_code_hash_of_a_folder_equals_that_of_its_commit(tmp_path):
    """gpu_runs/code_hash.py: the hash the pipeline records on the device (of the carried folder)
    is the one computed here from the commit, so a table names the code that ran."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    mod = load_script("gpu_runs/code_hash.py")
    if subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    subprocess.run(f"git -C {root} archive HEAD specheads | tar -x -C {tmp_path}", shell=True, check=True)
    folder = mod.folder_hash(tmp_path / "specheads")
    assert folder == mod.commit_hash("HEAD", repo=str(root)) and len(folder) == 12
    (tmp_path / "specheads" / "extra.py").write_text("x = 1\n")
    assert mod.folder_hash(tmp_path / "specheads") != folder


def test_scaling_table_from_fake_runs(tmp_path):
    """gpu_runs/scaling_table.py: tokens/s per GPU past the first steps, efficiency against one
    card, and each step's loss against one card's at the same global batch."""
    import json

    mod = load_script("gpu_runs/scaling_table.py")

    def write(name, per_s, loss_scale=1.0, slow_start=True):
        run = tmp_path / name
        run.mkdir()
        rows, tokens, t = [], 0.0, 0.0
        for step in range(1, 11):
            dt = 5.0 if (step == 1 and slow_start) else 1.0  # the first step compiles
            t += dt
            tokens += per_s * 1.0
            rows.append({"step": step, "loss": (10.0 - step * 0.5) * loss_scale, "tokens_per_s": tokens / t,
                         "elapsed_s": t})
        (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
        (run / "train_summary.json").write_text(json.dumps({"peak_gpu_mem_gib": 3.5}))

    write("weak1", 1000.0)
    write("weak2", 1800.0)
    write("eq1", 1000.0)
    write("eq2", 1800.0, loss_scale=1.0005)
    result = mod.table(tmp_path, skip_pct=20)
    one, two = result["weak"]
    assert one["tokens_per_s"] == pytest.approx(1000.0) and two["tokens_per_s_per_gpu"] == pytest.approx(900.0)
    assert two["efficiency"] == pytest.approx(0.9) and two["peak_gpu_mem_gib"] == 3.5
    (eq,) = result["equivalence"]
    assert eq["steps"] == 10 and eq["max_rel_loss_diff"] == pytest.approx(5e-4) and eq["within_1e-3"]
    import gzip

    for n, answer in ((1, "a"), (2, "a"), (4, "b")):  # 4 cards answered one conversation differently
        folder = tmp_path / f"regen{n}"
        folder.mkdir()
        with gzip.open(folder / "regenerated.jsonl.gz", "wt") as f:
            for i, text in enumerate(["x", answer]):
                f.write(json.dumps({"id": f"c{i}", "conversations": [{"from": "gpt", "value": text}]}) + "\n")
        (folder / "timing.json").write_text(json.dumps({"cards": n, "seconds": 100 // n}))
    regen = mod.table(tmp_path, skip_pct=20)["regeneration"]
    assert [(r["cards"], r["seconds"], r["same_as_one_card"]) for r in regen] == [(1, 100, None), (2, 50, True),
                                                                                  (4, 25, False)]


def test_a_tree_choice_is_current_only_for_the_same_candidates(tmp_path):
    """kinds_pipeline.sh tunes and benches a kind again where its saved choice was made among other
    candidates than the call's TREES (a warm machine given new trees)."""
    choice = tmp_path / "medusa-tree.json"
    choice.write_text(json.dumps({"chosen": "2,8,12", "candidates": {
        "medusa@2,4,6": {"speedup_vs_ar": 1.37}, "medusa@2,8,12": {"speedup_vs_ar": 1.42}}}))
    script = [sys.executable, "gpu_runs/kinds_table.py", "tree-current", str(choice)]
    run = lambda *c: subprocess.run(script + list(c), cwd=ROOT, capture_output=True).returncode  # noqa: E731
    assert run("2,8,12", "2,4,6") == 0  # order aside
    assert run("2,8,12", "2,10,15") == 1
    assert run("2,8,12") == 1


def test_pick_tree_by_chat_or_by_chat_and_coding():
    """`pick-tree --coding` (assist_bench.sh sweep) weighs coding's speedup with chat's: a tree that
    is second on chat but far ahead on coding wins; without it, chat alone decides; a report
    without coding is refused rather than judged on chat alone."""
    mod = load_script("gpu_runs/kinds_table.py")
    report = mod.fake_tuning()  # chat: 7,8,31 and 5,4,15 tie at 2.2 (the earlier wins), 6,4,15 2.0
    assert mod.pick_tree(report)["chosen"] == "7,8,31"
    with pytest.raises(SystemExit, match="no coding"):
        mod.pick_tree(report, coding=True)
    report["categories"] = {"coding": {"eagle3@6,4,15": {"speedup_vs_ar": 2.9, "mean_accept_length": 4},
                                       "eagle3@7,8,31": {"speedup_vs_ar": 2.3, "mean_accept_length": 4},
                                       "eagle3@5,4,15": {"speedup_vs_ar": 2.3, "mean_accept_length": 4}}}
    choice = mod.pick_tree(report, coding=True)
    assert choice["chosen"] == "6,4,15" and choice["candidates"]["eagle3@6,4,15"]["score"] == pytest.approx(2.45)
    assert mod.pick_tree(report)["chosen"] == "7,8,31"
    # a candidate with drafter options is chosen as written after its KIND@
    report["methods"].append({"name": "eagle3@6,4,15:ngram_gate_chain=31", "num_steps": 6, "topk": 4,
                              "num_draft_tokens": 15})
    report["chat_macro_average"]["eagle3@6,4,15:ngram_gate_chain=31"] = {"speedup_vs_ar": 2.5, "mean_accept_length": 4}
    assert mod.pick_tree(report)["chosen"] == "6,4,15:ngram_gate_chain=31"
