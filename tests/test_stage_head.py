"""gpu_runs/stage_head.sh: a head folder cut into parts here and joined on the device machine over
several calls, each carrying the folder's meta and some parts; the weights' sha256 is checked."""

import os
import shutil
import subprocess

from tests.helpers import REPO


def _run(*args, env=None):
    return subprocess.run(["bash", str(REPO / "gpu_runs/stage_head.sh"), *map(str, args)], capture_output=True,
                          text=True, env=env)


def _call(stage, parts, into):
    """What one device call carries: the meta folder and the named parts."""
    shutil.rmtree(into, ignore_errors=True)
    shutil.copytree(stage / "meta", into / "meta")
    for p in parts:
        shutil.copytree(stage / p, into / p)


def test_a_head_split_here_joins_there_over_calls(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    weights = os.urandom(1000)
    (head / "model.safetensors").write_bytes(weights)
    (head / "config.json").write_text('{"a": 1}')
    (head / "specheads.json").write_text('{"kind": "eagle3"}')
    stage = tmp_path / "split"
    r = _run("split", head, stage, 300)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in stage.iterdir()) == ["meta", "p00", "p01", "p02", "p03"]
    assert not (stage / "meta" / "model.safetensors").exists()
    env = dict(os.environ, HEAD_STAGE=str(tmp_path / "staging"))
    dest, carried = tmp_path / "dest" / "qwen-head", tmp_path / "carried"
    _call(stage, ["p00"], carried)
    r = _run("join", carried, dest, env=env)
    assert r.returncode == 0 and "300 of 1000 bytes" in r.stdout, r.stdout + r.stderr
    assert not (dest / "model.safetensors").exists()
    _call(stage, ["p01", "p02", "p03"], carried)
    r = _run("join", carried, dest, env=env)
    assert r.returncode == 0 and "ready" in r.stdout, r.stdout + r.stderr
    assert (dest / "model.safetensors").read_bytes() == weights
    assert (dest / "config.json").read_text() == '{"a": 1}' and (dest / "specheads.json").exists()
    assert not (dest / "SHA256").exists()
    assert "checked before" in _run("join", carried, dest, env=env).stdout


def test_a_damaged_part_is_refused(tmp_path):
    head = tmp_path / "head"
    head.mkdir()
    (head / "model.safetensors").write_bytes(os.urandom(600))
    stage = tmp_path / "split"
    assert _run("split", head, stage, 300).returncode == 0
    part = stage / "p01" / "part01"
    part.write_bytes(bytes(300))
    env = dict(os.environ, HEAD_STAGE=str(tmp_path / "staging"))
    r = _run("join", stage, tmp_path / "dest", env=env)
    assert r.returncode == 1 and "sha256" in r.stderr
    assert not (tmp_path / "dest" / "model.safetensors").exists()


def test_join_without_the_meta_says_what_to_carry(tmp_path):
    (tmp_path / "split" / "p00").mkdir(parents=True)
    r = _run("join", tmp_path / "split", tmp_path / "dest", env=dict(os.environ, HEAD_STAGE=str(tmp_path / "s")))
    assert r.returncode == 2 and "carry" in r.stderr
