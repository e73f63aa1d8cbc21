"""The speculation policy flags of `specheads generate` and `specheads serve`: adaptive decoding
from the command line equals --method ar, bad tiers and profiles are one-line user errors, and a
server's metrics count its steps by the tree verified."""

from __future__ import annotations

import json

import httpx
import pytest

from specheads.cli import main

PROMPTS = ["--prompt", "hi", "--prompt", "hello there"]


def _generate(capsys, target, *args):
    capsys.readouterr()
    code = main(["generate", "--target", str(target), *PROMPTS, "--max-new-tokens", "12", "--max-len", "128",
                 "--json", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_generate_adaptive_equals_ar(capsys, tiny_target_dir, tmp_path):
    code, out, err = _generate(capsys, tiny_target_dir, "--method", "ar")
    assert code == 0, err
    ar = json.loads(out)
    assert ar["stats"]["speculation_policy"] is None
    for extra in (["--speculation-policy", "adaptive"], ["--speculation-tiers", "1,1,1;2,1,2"],
                  ["--speculation-settings", "switch_margin=0.2"], ["--speculation-policy", "fixed"]):
        code, out, err = _generate(capsys, tiny_target_dir, "--method", "ngram", "--num-draft-tokens", "4", *extra)
        assert code == 0, err
        got = json.loads(out)
        assert [o["token_ids"] for o in got["outputs"]] == [o["token_ids"] for o in ar["outputs"]], extra
        # tiers alone imply the adaptive policy; the CPU default is fixed
        assert got["stats"]["speculation_policy"] == ("fixed" if "fixed" in extra else "adaptive")
    code, out, err = _generate(capsys, tiny_target_dir, "--method", "ngram")
    assert json.loads(out)["stats"]["speculation_policy"] == "fixed"


@pytest.mark.parametrize("bad, message", [
    (["--speculation-tiers", "8,1,8"], "tier 8,1,8 is larger than this engine's tree 4,1,4 (--num-steps 4 --topk 1 "
                                       "--num-draft-tokens 4), the maximum"),
    (["--speculation-tiers", "2,2,3"], "tier 2,2,3: this drafter drafts chains only, so topk must be 1"),
    (["--speculation-tiers", "2;1"], "tier 2 must be three integers >= 1"),
    (["--speculation-policy", "fixed", "--speculation-tiers", "1,1,1"],
     "--speculation-tiers applies to --speculation-policy adaptive"),
    (["--speculation-settings", "switch_margin"], "'switch_margin' is not NAME=VALUE; expected NAME=VALUE"),
])
def test_bad_policy_flags_are_user_errors(capsys, tiny_target_dir, bad, message):
    code, out, err = _generate(capsys, tiny_target_dir, "--method", "ngram", "--num-draft-tokens", "4", *bad)
    assert code == 2 and out == ""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("specheads generate: error: ") and message in err


def test_a_bad_profile_is_a_user_error(capsys, tiny_target_dir, tmp_path):
    path = tmp_path / "costs.json"
    path.write_text("{}")
    code, _, err = _generate(capsys, tiny_target_dir, "--method", "ngram", "--speculation-profile", str(path))
    assert code == 2 and f"speculation profile '{path}' has format None" in err


def test_served_steps_are_counted_by_tree(tiny_target_dir):
    from prometheus_client.parser import text_string_to_metric_families

    from specheads.server.app import ServerConfig, create_app
    from specheads.server.launch import load_engine
    from tests.server.conftest import running_server

    engine, tok, _ = load_engine(str(tiny_target_dir), None, method="ngram", num_draft_tokens=4, max_len=128,
                                 speculation_tiers="1,1,1;2,1,2")
    assert engine.policy.name == "adaptive" and [str(t) for t in engine.policy.tiers] == ["1,1,1", "2,1,2", "4,1,4"]
    app = create_app(engine, tok, ServerConfig("tiny"))
    with running_server(app) as (url, _):
        r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 12,
                                                      "temperature": 0}, timeout=60)
        assert r.status_code == 200
        text = httpx.get(url + "/metrics").text
    steps = {s.labels["tree"]: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
             if s.name == "specheads_steps_by_tree_total"}
    assert steps and set(steps) <= {"none", "1,1,1", "2,1,2", "4,1,4"} and sum(steps.values()) >= 1
