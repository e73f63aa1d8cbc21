"""Publishing heads to the Hub (against a stand-in server) and loading them back by hub id."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from specheads.cli import main
from specheads.heads.format import HeadFormatError, load_head
from specheads.hub import HubError, export_head, resolve_head
from specheads.publish import model_card, publish_head, scrub_paths
from tests.helpers import DRAFT_VOCAB, train_config
from tests.hub_server import StandInHub

REPO = "me/tiny-eagle3"
HEAD_FILES = {"README.md", "config.json", "model.safetensors", "specheads.json"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_target_dir, prepared_dir):
    """final/ of a 3-step run on the tiny target: its specheads.json holds real eval metrics."""
    from specheads.training.trainer import Trainer

    out = tmp_path_factory.mktemp("publish-run")
    Trainer(train_config(tiny_target_dir, prepared_dir, out, "train.max_steps=3")).run()
    return out / "final"


@pytest.fixture(autouse=True)
def no_token(monkeypatch, tmp_path):
    """No token from the environment or a saved login, whatever the machine has."""
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture()
def hub(monkeypatch):
    """The stand-in Hub as the endpoint, online, with a token in HF_TOKEN.

    huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE at import, so its constants are patched too."""
    from huggingface_hub import constants

    with StandInHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                            server.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        yield server


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def _meta(final):
    return json.loads((final / "specheads.json").read_text())


# ------------------------------------------------------------------ dry run and the model card
def test_dry_run_writes_the_upload_folder_offline(trained, tmp_path, capsys):
    """No token, HF_HUB_OFFLINE=1 (conftest): any request would fail, the dry run needs none."""
    out = tmp_path / "staged"
    assert main(["publish", str(trained), "--repo-id", REPO, "--dry-run", "--output", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert {p.name for p in out.iterdir()} == HEAD_FILES
    for name in HEAD_FILES:  # every file listed with its size
        assert f"{(out / name).stat().st_size:,d}  {name}" in stdout
    assert "nothing uploaded" in stdout and str(out) in stdout
    assert (out / "model.safetensors").read_bytes() == (trained / "model.safetensors").read_bytes()
    # the run's own metadata, its local paths cut to their last component
    assert _meta(trained)["target"].startswith("/") and _meta(out) == scrub_paths(_meta(trained))
    assert "--base-model ORG/NAME" in stdout  # the tiny target is a local folder: the card can name no base model
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    a, b = load_head(trained).state_dict(), load_head(out).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_dry_run_refuses_a_non_empty_output(trained, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("x")
    with pytest.raises(HubError, match="is not empty"):
        publish_head(trained, REPO, dry_run=True, output=tmp_path / "out")


def test_model_card_holds_the_runs_numbers(trained, tmp_path):
    out = publish_head(trained, REPO, dry_run=True, output=tmp_path / "s").folder
    card = (out / "README.md").read_text()
    front = _front_matter(card)
    assert front["library_name"] == "specheads" and front["license"] == "apache-2.0"
    assert front["pipeline_tag"] == "text-generation"
    assert {"eagle3", "speculative-decoding", "specheads"} <= set(front["tags"])
    assert "base_model" not in front  # the tiny target is a local folder, not a hub id
    meta = _meta(trained)
    train, data = meta["train"], meta["data"]
    assert len(train["eval/acc"]) == 2  # ttt_steps=2 in the test config
    for k, (acc, chain) in enumerate(zip(train["eval/acc"], train["eval/chain_acc"])):
        assert f"| {k} | {acc:.3f} | {chain:.3f} |" in card
    assert f"acceptance length: {train['eval/accept_length']:.3f} over {train['eval/positions']} positions" in card
    assert (f"first 256 tokens of first answers: {train['eval/accept_length_opening']:.3f} "
            f"({train['eval/positions_opening']} positions)") in card
    assert f"{data['conversations']['train']} train / {data['conversations']['eval']} held-out" in card
    assert f"{data['train_tokens']} train tokens" in card
    assert f"{train['steps']} optimizer steps" in card
    assert f"{DRAFT_VOCAB} of the target's 400 tokens" in card
    assert "outputs of layers [1, 3, 4]" in card and "inputs of layers [2, 4, 5]" in card
    assert f"--draft {REPO}" in card and "speculative-draft-model-path me/tiny-eagle3" in card
    assert '"model": "me/tiny-eagle3"' in card
    assert "## Decoding benchmark\n\nNot measured" in card


def test_model_card_with_bench_and_without_metadata(trained, tmp_path):
    bench = {"card": "NVIDIA H100", "dtype": "torch.bfloat16", "max_new_tokens": 64, "date": "2026-01-02",
             "draft": "runs/x/final", "rows": [
                 {"prompts": "coding", "batch": 1, "method": "ar", "tokens_per_s": 100.04,
                  "mean_accept_length": 1.0, "speedup_vs_ar": 1.0},
                 {"prompts": "coding", "batch": 1, "method": "eagle3-tree", "tokens_per_s": 250.55,
                  "mean_accept_length": 3.217, "speedup_vs_ar": 2.5045}]}
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    out = publish_head(trained, REPO, dry_run=True, output=tmp_path / "s", bench=tmp_path / "bench.json").folder
    card = (out / "README.md").read_text()
    assert "| coding | 1 | eagle3-tree | 250.6 | 3.22 | 2.50 |" in card and "NVIDIA H100" in card
    assert json.loads((out / "bench.json").read_text()) == bench
    # a head written by another tool: no specheads.json, so nothing measured is claimed
    bare = tmp_path / "bare"
    shutil.copytree(trained, bare)
    (bare / "specheads.json").unlink()
    card = (publish_head(bare, REPO, dry_run=True, output=tmp_path / "b").folder / "README.md").read_text()
    assert "Not measured: specheads.json holds no eval metrics." in card
    assert "Not recorded" in card
    with pytest.raises(FileNotFoundError, match="nope.json"):
        publish_head(trained, REPO, dry_run=True, output=tmp_path / "c", bench=tmp_path / "nope.json")


def test_card_shows_an_evaluation_suite_json(trained, tmp_path):
    suite = {"card": "NVIDIA H200", "dtype": "torch.bfloat16", "date": "2026-11-29", "split": "test", "batch_size": 1,
             "max_new_tokens": 256,
             "methods": [{"name": "ar"}, {"name": "eagle3@4,4,10"}],
             "categories": {
                 "writing": {"ar": {"prompts": 64, "tokens_per_s": 1011.6},
                             "eagle3@4,4,10": {"mean_accept_length": 3.214, "speedup_vs_ar": 1.9049}},
                 "coding": {"ar": {"prompts": 64, "tokens_per_s": 1015.2},
                            "eagle3@4,4,10": {"mean_accept_length": 2.887, "speedup_vs_ar": 1.7}}},
             "chat_macro_average": {"eagle3@4,4,10": {"mean_accept_length": 3.214, "speedup_vs_ar": 1.9049}}}
    (tmp_path / "suite.json").write_text(json.dumps(suite))
    card = (publish_head(trained, REPO, dry_run=True, output=tmp_path / "s", bench=tmp_path / "suite.json").folder
            / "README.md").read_text()
    assert "| category | prompts | plain tokens/s | eagle3@4,4,10 accept | eagle3@4,4,10 speedup |" in card
    assert "| writing | 64 | 1012 | 3.21 | 1.90x |" in card and "| coding | 64 | 1015 | 2.89 | 1.70x |" in card
    assert "| chat (mean of the non-coding categories) | | | 3.21 | 1.90x |" in card
    assert "(test split) on NVIDIA H200, bfloat16, batch 1, 256 new tokens" in card


def test_card_says_a_gguf_target_was_dequantized_and_names_the_starting_head(trained):
    head = load_head(trained)
    meta = {"target": "/tmp/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "data": {"regenerated": True},
            "run_config": {"train": {"lr": 3e-4, "init_from": "/tmp/runs/qwen/final"}}}
    card = model_card(head.config, meta, meta["target"], REPO, "bfloat16", None,
                      base_model="Qwen/Qwen2.5-Coder-0.5B-Instruct")
    assert "dequantized from the GGUF file `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`" in card
    assert "starting from an earlier head (`<local>/final`)" in card and "/tmp/" not in card
    meta["target"] = "Org/Target-1B"  # a hub checkpoint: nothing dequantized, no earlier head
    del meta["run_config"]["train"]["init_from"]
    card = model_card(head.config, meta, meta["target"], REPO, "bfloat16", None)
    assert "dequantized" not in card and "earlier head" not in card


def test_card_names_a_hub_target_as_base_model(trained):
    head = load_head(trained)
    front = _front_matter(model_card(head.config, {"license": "mit"}, "Org/Target-1B", REPO, "bfloat16", None))
    assert front["base_model"] == "Org/Target-1B" and front["license"] == "mit"
    front = _front_matter(model_card(head.config, {}, "smollm2-135m-instruct", REPO, "bfloat16", None))
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # the embedded GGUF staged at another path (a GPU box's /tmp) is still the default target
    front = _front_matter(model_card(head.config, {}, "/tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf", REPO, "bfloat16",
                                     None))
    assert front["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"


# a path at the start of a string or after a space, quote, '=', ':' or bracket; not a URL's '//'
ABSOLUTE = re.compile(r"""(?:^|[\s`'"=:(\[{,])(?:/(?!/)|~/)\S""")


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_no_local_path_in_any_published_file(trained, tmp_path, tmp_path_factory):
    """The run's target, data, output and prepared folders are absolute here (tmp paths); a data
    report or a bench file may name more. None of them may reach the Hub."""
    head = tmp_path / "head"
    shutil.copytree(trained, head)
    meta = _meta(head)
    meta["run_config"]["train"]["offline_cache_dir"] = str(tmp_path / "cache" / "shards")
    meta["data"]["extra"] = {"sources": [str(tmp_path / "a.json"), {"home": "~/data/b.jsonl"}],
                             "note": f"read from {tmp_path / 'c.parquet'} at step 3",
                             "file_url": f"file://{tmp_path / 'd.json'}",
                             "page": "https://huggingface.co/datasets/org/sharegpt"}
    (head / "specheads.json").write_text(json.dumps(meta))
    bench = {"card": "NVIDIA H100", "draft": str(head), "target": str(tmp_path / "gguf" / "model.gguf"),
             "rows": [{"prompts": "coding", "batch": 1, "method": "ar", "tokens_per_s": 10.0,
                       "mean_accept_length": 1.0, "speedup_vs_ar": 1.0}]}
    (head / "bench.json").write_text(json.dumps(bench))
    out = publish_head(head, REPO, dry_run=True, output=tmp_path / "s").folder
    assert {p.name for p in out.iterdir()} == HEAD_FILES | {"bench.json"}

    local = [str(tmp_path_factory.getbasetemp()), str(Path.home()), "~/"]
    for name in HEAD_FILES - {"model.safetensors"} | {"bench.json"}:
        text = (out / name).read_text()
        assert not any(x in text for x in local), name
        if name.endswith(".json"):
            strings = list(_strings(json.loads(text)))
            assert not [x for x in strings if ABSOLUTE.search(x)], name
        else:
            assert not ABSOLUTE.findall(text.replace("https://", "")), name
    published = _meta(out)
    assert published["target"] == published["data"]["target"] == "<local>/" + Path(meta["target"]).name
    assert published["run_config"]["output_dir"] == "<local>/" + Path(meta["run_config"]["output_dir"]).name
    assert published["run_config"]["train"]["offline_cache_dir"] == "<local>/shards"
    assert published["data"]["extra"] == {"sources": ["<local>/a.json", {"home": "<local>/b.jsonl"}],
                                          "note": "read from <local>/c.parquet at step 3",
                                          "file_url": "<local>/d.json",
                                          "page": "https://huggingface.co/datasets/org/sharegpt"}
    assert published["train"] == meta["train"]  # the numbers are untouched
    assert json.loads((out / "config.json").read_text())["specheads_target"] == published["target"]
    assert json.loads((out / "bench.json").read_text())["target"] == "<local>/model.gguf"
    card = (out / "README.md").read_text()
    # no hub id to launch with: a placeholder the card says to fill in
    assert "--target <path or hub id of the target> --draft me/tiny-eagle3" in card
    assert "Replace `<path or hub id of the target>`" in card


def test_base_model_names_a_local_target(trained, tmp_path, capsys):
    out = tmp_path / "staged"
    assert main(["publish", str(trained), "--repo-id", REPO, "--dry-run", "--output", str(out),
                 "--base-model", "Org/Target-1B"]) == 0
    assert "--base-model" not in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert _front_matter(card)["base_model"] == "Org/Target-1B"
    assert "--target Org/Target-1B --draft me/tiny-eagle3" in card and "--model-path Org/Target-1B" in card
    assert "vllm serve Org/Target-1B" in card and "<path or hub id of the target>" not in card
    assert json.loads((out / "config.json").read_text())["specheads_target"] == "Org/Target-1B"


@pytest.mark.parametrize("base", ["Target-1B", "/models/target", "org/na me", "org/x--y"])
def test_malformed_base_model(trained, tmp_path, capsys, base):
    out = tmp_path / "staged"
    assert main(["publish", str(trained), "--repo-id", REPO, f"--base-model={base}", "--dry-run",
                 "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specheads publish: error: --base-model") and repr(base) in err and "'org/name'" in err
    assert not out.exists()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weights_are_refused(trained, hub, tmp_path, capsys, bad):
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    name = next(k for k in sorted(tensors) if k.startswith("midlayer") and tensors[k].is_floating_point())
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[:3] = bad
    save_file(tensors, str(broken / "model.safetensors"))
    out = tmp_path / "staged"
    assert main(["publish", str(broken), "--repo-id", REPO, "--dry-run", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specheads publish: error: ") and "Traceback" not in err
    assert repr(name) in err and "3 non-finite values" in err and str(broken) in err
    assert not out.exists()
    with pytest.raises(HubError, match=re.escape(repr(name))):
        publish_head(broken, REPO)  # the real upload: refused before any request
    assert hub.requests == []


@pytest.mark.parametrize("fmt", ["sglang", "vllm"])
def test_published_export_loads_in_both_engines(trained, tmp_path, fmt):
    """An engine-specific export (one layer-id key) goes up with both keys and the same drafts."""
    exported = export_head(trained, fmt, tmp_path / fmt)
    out = publish_head(exported, REPO, dry_run=True, output=tmp_path / "s").folder
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    original, back = load_head(trained), load_head(out)
    x = torch.randn(2, 3, original.config.hidden_size)
    assert torch.equal(back.logits(x), original.logits(x))


# ------------------------------------------------------------------ errors before any upload
@pytest.mark.parametrize("repo_id", ["tiny-eagle3", "me/tiny/eagle3", "me/na me", "-me/x", "me/x--y", "me/"])
def test_malformed_repo_id(trained, capsys, repo_id):
    assert main(["publish", str(trained), f"--repo-id={repo_id}", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specheads publish: error: --repo-id") and repr(repo_id) in err and "'org/name'" in err


def test_missing_token_fails_before_any_request(trained, hub, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    assert main(["publish", str(trained), "--repo-id", REPO]) == 2
    err = capsys.readouterr().err
    assert "no Hugging Face token" in err and "--token" in err and "HF_TOKEN" in err and "huggingface-cli login" in err
    assert hub.requests == []


def test_broken_folder_fails_before_any_request(trained, hub, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(trained, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    tensors["embed_tokens.weight"] = torch.zeros(4, 4)
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(HeadFormatError, match="contains embed_tokens") as e:
        publish_head(broken, REPO)
    assert str(broken) in str(e.value)
    assert hub.requests == []


# ------------------------------------------------------------------ upload through the Hub API
def test_publish_uploads_the_staged_folder(trained, hub, tmp_path, capsys):
    staged = publish_head(trained, REPO, dry_run=True, output=tmp_path / "staged").folder
    assert main(["publish", str(trained), "--repo-id", REPO, "--private", "--commit-message", "first head"]) == 0
    assert "published" in capsys.readouterr().out
    # the calls the real client made, in order: look (repo missing), create, preupload, commit
    create = hub.calls("POST", "/api/repos/create")
    assert len(create) == 1 and json.loads(create[0].body) == {"name": "tiny-eagle3", "organization": "me",
                                                                "visibility": "private", "type": "model"}
    commit = hub.calls("POST", f"/api/models/{REPO}/commit/main")
    assert len(commit) == 1 and len(hub.calls("POST", f"/api/models/{REPO}/preupload/main")) == 1
    order = [r.path for r in hub.requests]
    assert order.index(f"/api/models/{REPO}/revision/main") < order.index("/api/repos/create") < order.index(
        f"/api/models/{REPO}/commit/main")
    repo_calls = [r for r in hub.requests if r.path.startswith(("/api/models/", "/api/repos/"))]
    assert len(repo_calls) >= 4 and all(r.headers.get("authorization") == "Bearer hf_test_token" for r in repo_calls)
    header = json.loads(commit[0].body.decode().splitlines()[0])
    assert header["value"]["summary"] == "first head"
    # what reached the Hub is exactly the dry run's folder
    _, files = hub.repos[REPO].files_at("main")
    assert set(files) == HEAD_FILES | {".gitattributes"}
    for name in HEAD_FILES:
        assert files[name] == (staged / name).read_bytes(), name
    assert files["model.safetensors"] == (trained / "model.safetensors").read_bytes()
    assert _front_matter(files["README.md"].decode())["tags"][:3] == ["eagle3", "speculative-decoding", "specheads"]
    assert hub.repos[REPO].private

    # the same head again: nothing to do, no commit
    assert main(["publish", str(trained), "--repo-id", REPO]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert len(hub.calls("POST", f"/api/models/{REPO}/commit/main")) == 1


def test_publish_refuses_a_repo_with_another_head(trained, hub, tmp_path, capsys):
    publish_head(trained, REPO)
    other = tmp_path / "other"
    shutil.copytree(trained, other)
    tensors = load_file(str(other / "model.safetensors"))
    tensors["norm.weight"] = tensors["norm.weight"] + 1
    save_file(tensors, str(other / "model.safetensors"))
    assert main(["publish", str(other), "--repo-id", REPO]) == 2
    err = capsys.readouterr().err
    assert "me/tiny-eagle3@main already holds other content" in err and "model.safetensors" in err
    assert "README.md" not in err.split("(")[1]  # same card: only the weights differ
    assert "--force" in err
    assert len(hub.calls("POST", f"/api/models/{REPO}/commit/main")) == 1
    result = publish_head(other, REPO, force=True)
    assert result.status == "uploaded" and result.differs == ["model.safetensors"]
    assert hub.repos[REPO].files_at("main")[1]["model.safetensors"] == (other / "model.safetensors").read_bytes()


def test_publish_to_a_new_branch(trained, hub):
    publish_head(trained, REPO)
    hub.repos[REPO].commit("main", {}, "emptied")  # the branch will start from a bare main
    assert publish_head(trained, REPO, revision="v2", commit_message="on a branch").status == "uploaded"
    assert len(hub.calls("POST", f"/api/models/{REPO}/branch/v2")) == 1
    assert len(hub.calls("POST", f"/api/models/{REPO}/commit/v2")) == 1
    assert set(hub.repos[REPO].files_at("v2")[1]) == HEAD_FILES and hub.repos[REPO].files_at("main")[1] == {}
    assert load_head(f"{REPO}@v2").config.draft_vocab_size == DRAFT_VOCAB


# ------------------------------------------------------------------ --draft <hub id>
def test_draft_hub_id_downloads_then_loads_offline(trained, hub, monkeypatch, tmp_path):
    from huggingface_hub import constants

    publish_head(trained, REPO)
    online = load_head(REPO)  # downloads into the (test) HF cache
    assert str(resolve_head(REPO)).startswith(constants.HF_HUB_CACHE)
    assert len(hub.calls("GET", f"/{REPO}/resolve/[0-9a-f]{{40}}/model.safetensors")) == 1
    n_requests = len(hub.requests)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for spec in (REPO, f"{REPO}@main"):
        offline = load_head(spec)
        a, b, c = load_head(trained).state_dict(), offline.state_dict(), online.state_dict()
        assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], c[k]) for k in a)
    exported = export_head(REPO, "vllm", tmp_path / "v")
    assert json.loads((exported / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    x = torch.randn(2, 5, offline.config.hidden_size)
    assert torch.equal(offline.logits(x), load_head(trained).logits(x))  # same drafts as from the folder
    assert len(hub.requests) == n_requests  # offline: the stand-in saw nothing more


def test_draft_hub_id_offline_and_not_cached(capsys, tmp_path):
    with pytest.raises(HubError, match=r"me/never-published is not in the cache .* HF_HUB_OFFLINE=1"):
        load_head("me/never-published")
    assert main(["export", "me/never-published", "--format", "sglang", "--output", str(tmp_path / "x")]) == 2
    assert "me/never-published" in capsys.readouterr().err


def test_draft_hub_id_not_on_the_hub(trained, hub):
    with pytest.raises(HubError, match="me/missing does not exist"):
        load_head("me/missing")
    publish_head(trained, REPO)
    with pytest.raises(HubError, match="me/tiny-eagle3 has no revision 'v2'"):
        load_head(f"{REPO}@v2")


def test_local_folder_wins_over_a_hub_id(trained, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(trained, tmp_path / "me" / "tiny-eagle3")
    assert resolve_head(REPO) == tmp_path.joinpath("me", "tiny-eagle3").relative_to(tmp_path)
    load_head(REPO)  # offline, nothing cached: only the local folder can satisfy this
    with pytest.raises(FileNotFoundError, match="neither an existing folder nor a hub id"):
        load_head("runs/a/final")
