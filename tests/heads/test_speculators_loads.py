"""An EAGLE-3 head exported with `--format speculators` loads in vLLM's speculators library itself
(the pinned 0.9.0, which scripts/setup.sh installs beside the project in its own folder: its
declared pins would move transformers) and computes the same draft logits as ours.

The library's loader is the reference: its config class parses the exported config.json, its
model takes every exported tensor (none missing, none left over), attaches the verifier's
embedding from the target folder named in the config (a hub id where the target is one; a local
target's folder is written in by hand, as here), and its first TTT step over the same
target features and tokens gives our head's logits (float32, positions shifted by one: rotary
attention does not see the shift)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specheads.heads.eagle3 import Eagle3Config, Eagle3Head
from specheads.heads.format import save_head
from specheads.hub import export_head
from specheads.target.loader import load_target
from tests.helpers import build_tokenizer, randomize_, save_random_target, tiny_llama_config

SPECULATORS_VERSION = "0.9.0"
SITE = Path(os.environ.get("SPECHEADS_SPECULATORS_SITE", Path(sys.prefix) / "speculators"))

LOAD = r"""
import json, sys, torch
from safetensors.torch import load_file
from speculators import SpeculatorModel
folder, case = sys.argv[1], torch.load(sys.argv[2])
model = SpeculatorModel.from_pretrained(folder).float().eval()
saved, state = load_file(folder + "/model.safetensors"), model.state_dict()
# the library attaches the verifier's embedding only where the loaded one holds a NaN, but the
# missing tensor comes out of from_pretrained uninitialised (left unattached in 1 of 12 loads here):
# attach it as the loader means to
model._load_verifier_weights(overwrite_embed_tokens=True)
captured = []
model.lm_head.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
with torch.no_grad():
    tokens = model(hidden_states=case["aux"], input_ids=case["ids"], document_ids=torch.zeros_like(case["ids"]),
                   ttt_steps=1)
print(json.dumps({
    "class": type(model).__name__,
    "not_in_file": sorted(set(state) - set(saved)), "not_in_model": sorted(set(saved) - set(state)),
    "unequal": sorted(k for k in set(saved) & set(state) if not torch.equal(saved[k].float(), state[k].float())),
    "max_logit_diff": (captured[0] - case["logits"]).abs().max().item(),
    "tokens_equal": bool(torch.equal(tokens[0], case["logits"].argmax(-1))),
    "embed_equal": bool(torch.equal(model.embed_tokens.weight, case["embed"])),
    "t2d_equal": bool(torch.equal(model.t2d.bool(), case["t2d"])) if model.t2d is not None else None,
}))
"""


def speculators_env() -> dict:
    if not (SITE / "speculators").is_dir():
        missing = f"speculators=={SPECULATORS_VERSION} is not installed in {SITE} (scripts/setup.sh puts it there)"
        if os.environ.get("SPECHEADS_CI"):  # .ci/run ran setup.sh: a missing install is a failure there
            pytest.fail(missing)
        pytest.skip(missing)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return env


@pytest.mark.parametrize("draft_vocab", [None, 48])
def test_speculators_loads_the_export_and_drafts_alike(tmp_path, draft_vocab):
    env = speculators_env()
    vocab = 64
    target_dir = tmp_path / "target"
    save_random_target(target_dir, tiny_llama_config(vocab), build_tokenizer(vocab), randomize=True)
    target, _, _ = load_target(target_dir)
    torch.manual_seed(1)
    head = Eagle3Head(Eagle3Config.for_target(target, draft_vocab_size=draft_vocab or vocab)).eval()
    randomize_(head, seed=3, std=0.2)
    t2d = torch.ones(vocab, dtype=torch.bool)
    if draft_vocab:  # a draft vocabulary of scattered target ids
        keep = torch.randperm(vocab, generator=torch.Generator().manual_seed(5))[:draft_vocab].sort().values
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[keep] = True
        head.set_vocab_map(keep - torch.arange(draft_vocab), t2d)
    folder = save_head(head, tmp_path / "final", torch.float32, target_name=str(target_dir))
    out = export_head(folder, "speculators", tmp_path / "spec")
    config = json.loads((out / "config.json").read_text())
    # a local target is no hub id: the export leaves the verifier null, and the library's loader
    # (unlike vLLM, which reads only the config) then fails; a user names their target's folder
    assert config["speculators_config"]["verifier"]["name_or_path"] is None
    config["speculators_config"]["verifier"]["name_or_path"] = str(target_dir)
    (out / "config.json").write_text(json.dumps(config))

    # our first draft step over target features [1, T, 3H] and the next tokens
    t = 9
    aux = torch.randn(1, t, 3 * target.spec.hidden_size, generator=torch.Generator().manual_seed(7))
    ids = torch.randint(0, vocab, (1, t), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        embeds = target.embed_tokens(ids)
        hidden, _, _ = head.step(embeds, head.project(aux), torch.arange(t)[None])
        logits = head.logits(hidden)
    case = {"aux": aux, "ids": ids, "logits": logits, "embed": target.embed_tokens.weight.detach().clone(),
            "t2d": t2d}
    torch.save(case, tmp_path / "case.pt")

    run = subprocess.run([sys.executable, "-c", LOAD, str(out), str(tmp_path / "case.pt")], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["class"] == "Eagle3DraftModel"
    # verifier-owned tensors (the embedding, the verifier's own lm_head and norm) are not in the file
    assert not [k for k in got["not_in_file"] if not k.startswith(("embed_tokens", "verifier_"))], got["not_in_file"]
    assert got["not_in_model"] == [] and got["unequal"] == []
    assert got["embed_equal"], got
    if draft_vocab:
        assert got["t2d_equal"], got
    assert got["max_logit_diff"] < 1e-4, got
    assert got["tokens_equal"], got


def test_the_pinned_version_is_what_setup_installs_and_exports_name():
    setup = (Path(__file__).resolve().parents[2] / "scripts" / "setup.sh").read_text()
    assert f"speculators=={SPECULATORS_VERSION}" in setup
    from specheads.heads.eagle3 import SPECULATORS_VERSION as written

    assert written == SPECULATORS_VERSION


LOAD_MTP = r"""
import json, sys, torch
from safetensors.torch import load_file
from speculators import SpeculatorModel
folder, case = sys.argv[1], torch.load(sys.argv[2])
model = SpeculatorModel.from_pretrained(folder).float().eval()
saved, state = load_file(folder + "/model.safetensors"), model.state_dict()
# from_pretrained attached the verifier's embedding and lm_head (the target folder named in the config)
with torch.no_grad():
    logits = model(input_ids=case["ids"], hidden_states=case["hidden"])[0][0]
n = logits.shape[1]
print(json.dumps({
    "class": type(model).__name__,
    "not_in_file": sorted(set(state) - set(saved)), "not_in_model": sorted(set(saved) - set(state)),
    "unequal": sorted(k for k in set(saved) & set(state) if not torch.equal(saved[k].float(), state[k].float())),
    "positions": n, "max_logit_diff": (logits - case["logits"][:, :n]).abs().max().item(),
    "verifier_attached": bool(torch.isfinite(model.embed_tokens.weight).all() and torch.isfinite(model.lm_head.weight).all()),
}))
"""


def test_speculators_loads_a_qwen3_mtp_export_and_predicts_alike(tmp_path):
    """A one-module, full-vocabulary MTP head of a Qwen3 target (its module with the target's q/k norms)
    exports to speculators' mtp type; the library's MTPDraftModel takes every tensor, attaches the
    verifier's embedding and lm_head from the target folder, and its first step's logits over the same
    target hidden states and tokens are our module's (float32)."""
    from transformers import Qwen3Config

    from specheads.heads.mtp import MTPConfig, MTPHead, mtp_unroll
    from tests.helpers import tiny_config_kwargs

    env = speculators_env()
    vocab = 64
    target_dir = tmp_path / "target"
    save_random_target(target_dir, Qwen3Config(**tiny_config_kwargs(vocab, tie_word_embeddings=False)),
                       build_tokenizer(vocab), randomize=True)
    target, _, _ = load_target(target_dir)
    torch.manual_seed(1)
    head = MTPHead(MTPConfig.for_target(target, draft_vocab_size=vocab, num_modules=1)).eval()
    assert head.config.qk_norm and head.config.target_model_type == "qwen3"
    randomize_(head, seed=3, std=0.2)
    head.init_readout_from_target(target)  # the target's own lm_head, as training keeps it over the full vocabulary
    folder = save_head(head, tmp_path / "final", torch.float32, target_name=str(target_dir))
    out = export_head(folder, "speculators", tmp_path / "spec")
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "mtp" and config["architectures"] == ["MTPDraftModel"]
    assert config["transformer_layer_config"]["model_type"] == "qwen3" and config["num_nextn_predict_layers"] == 1
    config["speculators_config"]["verifier"]["name_or_path"] = str(target_dir)  # a local target: named by hand
    (out / "config.json").write_text(json.dumps(config))

    t = 9
    hidden = torch.randn(1, t, target.spec.hidden_size, generator=torch.Generator().manual_seed(7))
    ids = torch.randint(0, vocab, (1, t), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        outputs = mtp_unroll(head, target.embed_tokens, ids, hidden, 1)
        logits = head.logits(outputs[0])  # position i: from token i+1 and hidden i
    torch.save({"hidden": hidden, "ids": ids, "logits": logits}, tmp_path / "case.pt")

    run = subprocess.run([sys.executable, "-c", LOAD_MTP, str(out), str(tmp_path / "case.pt")], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["class"] == "MTPDraftModel"
    # the verifier's own tensors (embedding, lm_head) are not in the file; everything else is
    assert not [k for k in got["not_in_file"] if not k.startswith(("embed_tokens", "lm_head", "verifier_"))], got
    assert got["not_in_model"] == [] and got["unequal"] == []
    assert got["verifier_attached"], got
    assert got["positions"] >= 5 and got["max_logit_diff"] < 1e-4, got
