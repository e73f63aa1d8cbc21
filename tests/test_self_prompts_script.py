"""gpu_runs/self_prompts.sh on CPU with a tiny target: prompts sampled, answered by the target, and
the answers returned in parts that join into the regeneration's file."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_self_prompts_script_samples_answers_and_returns_the_conversations(tmp_path, chatty_target_dir):
    root, out = tmp_path / "sp", tmp_path / "out"
    # the tiny target seldom ends a turn: keep prompts cut at max-tokens out of the question by a large cap
    env = {**os.environ, "NGPU": "0", "PY": sys.executable, "TARGET": str(chatty_target_dir), "ROOT": str(root),
           "OUT": str(out), "COUNT": "6", "SAMPLE_ARGS": "--max-tokens 300 --min-words 1 --batch-size 6",
           "REGEN_ARGS": "--max-new-tokens 4 --batch-size 6 --max-length 512 --num-proc 1 --eval-fraction 0.2"}
    done = subprocess.run(["bash", "gpu_runs/self_prompts.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "self-prompts: answered" in done.stdout, log
    info = json.loads((out / "self_prompts_info.json").read_text())
    assert info["sampled"] == 6 and info["kept"] >= 1, info
    parts = sorted((out / "regen-self-prompts").glob("part*"))
    assert parts, log
    with gzip.open(root / "prepared" / "regenerated.jsonl.gz", "rb") as f:
        whole = f.read()
    assert gzip.decompress(b"".join(p.read_bytes() for p in parts)) == whole
    rows = [json.loads(line) for line in whole.decode().splitlines() if line.strip()]
    assert rows and all(r["id"].startswith("self-") and r["messages"][-1]["role"] == "assistant" for r in rows)
    # a second call finds the work done and returns it again
    again = subprocess.run(["bash", "gpu_runs/self_prompts.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and "sampling" not in again.stdout and "answering" not in again.stdout, again.stdout
