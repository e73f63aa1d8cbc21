"""`python serve/server.py` as a user runs it: loads the target, answers on loopback, and
exits cleanly on SIGTERM; load errors are one line with exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specheads.cli import main
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_serve_entry_point_serves_and_stops_on_sigterm(tiny_target_dir):
    port = free_port()
    env = {**os.environ, "SPECHEADS_API_KEY": "k", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "serve/server.py", "--target", str(tiny_target_dir), "--method", "ar",
                             "--port", str(port), "--max-len", "64", "--served-model-name", "tiny"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        auth = {"Authorization": "Bearer k"}
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3,
                                                      "temperature": 0}, headers=auth, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
        assert r.json()["speculation"]["draft_tokens"] == 0  # --method ar
        assert httpx.get(url + "/v1/models").status_code == 401  # the key came from SPECHEADS_API_KEY
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out  # a drained shutdown exits cleanly
    assert "Application shutdown complete" in out and "Traceback" not in out
    assert f"on http://127.0.0.1:{port}/v1" in out


def test_serve_missing_head_is_a_user_error(capsys, tmp_path, tiny_target_dir):
    missing = tmp_path / "no-head"
    code = main(["serve", "--target", str(tiny_target_dir), "--draft", str(missing), "--port", str(free_port())])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("specheads serve: error: ") and str(missing) in err


def test_served_model_name():
    from pathlib import Path

    from specheads.server.launch import model_name

    cache = Path("/root/.cache/specheads/gguf/SmolLM2-135M-Instruct.Q4_1-7a84ab7e")
    assert model_name(None, cache) == "SmolLM2-135M-Instruct"  # the embedded default, not its cache folder
    assert model_name("smollm2-135m-instruct", cache) == "SmolLM2-135M-Instruct"
    assert model_name("Org/Model-7B", Path("/hf/cache/x")) == "Org/Model-7B"
    assert model_name(str(Path(__file__)), Path("/x")) == Path(__file__).name
