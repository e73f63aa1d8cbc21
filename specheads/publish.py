"""Publish a head folder to the Hugging Face Hub, with a model card built from the run's own files.

Order matters: the repo id and the head are checked, and the folder to upload is staged,
before anything touches the network; then the token; then the remote repo is compared with
what would be uploaded, so a repo holding another head is never overwritten by accident.
Every number on the card is read from `specheads.json` (eval metrics, data report) or a
`scripts/bench.py` result; what was not measured is said to be not measured.
Nothing local goes up: absolute and home-relative paths in the published files (the run's
target, data, output and prepared folders) are cut to their last component.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specheads.heads.format import CONFIG_FILE, META_FILE, WEIGHTS_FILE, hf_config, load_head, read_folder_config
from specheads.heads.registry import kind_of
from specheads.hub import (DEFAULT_TARGET_HUB_ID, TARGET_PLACEHOLDER, HubError, base_model_id,  # noqa: F401
                           check_repo_id, resolve_head)

CARD_FILE = "README.md"
BENCH_FILE = "bench.json"
TAGS = ["speculative-decoding", "specheads", "draft-model"]  # after the head kind's name
ENGINES = {"sglang": "SGLang", "vllm": "vLLM"}  # export format -> how the card names its engine
# an absolute or home-relative path inside a string: at its start or after a space, quote, '=', ':',
# ',' or bracket; a URL's '//' is not one (file:// URLs are)
LOCAL_PATH = re.compile(r"""(?<![^\s'"=:(\[{,;])(?:file://)?(?:~[\w.-]*/|/(?![/\s])|[A-Za-z]:\\)[^\s'"()\[\]{},;]*""")


@dataclass
class PublishResult:
    folder: Path  # the staged folder (dry run: kept; upload: removed afterwards)
    files: dict[str, int]  # name -> size in bytes
    status: str  # "dry-run", "uploaded" or "up-to-date"
    url: str | None = None
    differs: list[str] = field(default_factory=list)  # remote files this upload replaced (--force)
    base_model: str | None = None  # the card's base_model (None: the target is local and --base-model was not given)


def publish_head(head: str | Path, repo_id: str, *, private: bool = False, revision: str = "main",
                 dry_run: bool = False, output: str | Path | None = None, token: str | None = None,
                 commit_message: str | None = None, bench: str | Path | None = None,
                 force: bool = False, base_model: str | None = None) -> PublishResult:
    check_repo_id(repo_id)
    if base_model is not None:
        check_repo_id(base_model, "--base-model")
    src = resolve_head(head)
    bench_path = Path(bench) if bench else src / BENCH_FILE
    if bench and not bench_path.is_file():
        raise FileNotFoundError(f"--bench {str(bench)!r} does not exist (a JSON written by scripts/bench.py)")
    if dry_run:
        stage = Path(output) if output else Path(tempfile.mkdtemp(prefix="specheads-publish-"))
        if stage.exists() and any(stage.iterdir()):
            raise HubError(f"--output {str(stage)!r} is not empty; the dry run writes exactly what would be uploaded")
        files, base = stage_head(src, stage, repo_id, bench_path if bench_path.is_file() else None, base_model)
        return PublishResult(stage, files, "dry-run", base_model=base)

    with tempfile.TemporaryDirectory(prefix="specheads-publish-") as tmp:
        stage = Path(tmp)
        files, base = stage_head(src, stage, repo_id, bench_path if bench_path.is_file() else None, base_model)
        token = token or _saved_token()
        if not token:
            raise HubError("no Hugging Face token: pass --token, set HF_TOKEN, or run `huggingface-cli login` "
                           "(a token with write access to " + repo_id.split("/")[0] + ")")
        commit_message = commit_message or f"Upload {read_folder_config(src)[0].title} draft head ({len(files)} files)"
        return _upload(stage, files, str(head), repo_id, private, revision, token, commit_message, force, base)


def stage_head(src: Path, stage: Path, repo_id: str, bench_path: Path | None,
               base_model: str | None = None) -> tuple[dict[str, int], str | None]:
    """Write the folder that goes to the Hub: the validated head, both engines' config keys, the card.

    Returns the staged files (name -> size) and the card's base model."""
    check_finite(src)
    head = load_head(src)  # validates names, shapes, dtypes, d2t/t2d before anything is written
    dtype = next(p.dtype for p in head.parameters())
    raw = json.loads((src / CONFIG_FILE).read_text())
    meta = json.loads((src / META_FILE).read_text()) if (src / META_FILE).is_file() else {}
    target = raw.get("specheads_target") or meta.get("target")
    base = base_model or base_model_id(target)
    stage.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / WEIGHTS_FILE, stage / WEIGHTS_FILE)  # the validated bytes, as they are
    # an engine-specific export carries one layer-id key; the published folder loads in both engines
    config = hf_config(head.config, dtype, base or scrub_paths(target))
    (stage / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    if not meta:
        meta = {"kind": kind_of(head).name, "layer_id_convention": "output of 0-based target decoder layer",
                "config": head.config.to_dict()}
    meta = scrub_paths(json.loads(json.dumps(meta, default=str)))
    (stage / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    bench_report = None
    if bench_path is not None:
        bench_report = scrub_paths(json.loads(bench_path.read_text()))
        (stage / BENCH_FILE).write_text(json.dumps(bench_report, indent=2) + "\n")
    (stage / CARD_FILE).write_text(model_card(head.config, meta, target, repo_id, str(dtype).replace("torch.", ""),
                                              bench_report, base_model=base))
    return {p.name: p.stat().st_size for p in sorted(stage.iterdir())}, base


def check_finite(src: Path) -> None:
    """Refuse NaN or inf weights before anything is staged: a head that diverged drafts nothing useful."""
    import torch
    from safetensors import SafetensorError, safe_open

    if not (src / WEIGHTS_FILE).is_file():
        return  # load_head says what is missing
    try:
        with safe_open(str(src / WEIGHTS_FILE), "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad = int((~torch.isfinite(t)).sum())
                    raise HubError(f"head {str(src)!r}: tensor {name!r} has {bad} non-finite values (NaN or inf) "
                                   f"of {t.numel()}; publish a head whose weights are all finite (e.g. an earlier "
                                   "checkpoint, or retrain with a lower train.lr)")
    except SafetensorError:
        return  # not a readable safetensors file: load_head names the problem


def scrub_paths(value):
    """`value` (JSON: dicts, lists, strings, numbers) with every absolute or home-relative path cut to
    `<local>/<last component>`, in keys and values at any depth."""
    if isinstance(value, dict):
        return {scrub_paths(k): scrub_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub_paths(v) for v in value]
    if isinstance(value, str):
        return LOCAL_PATH.sub(_local_name, value)
    return value


def _local_name(match: re.Match) -> str:
    name = re.split(r"[/\\]", match.group(0).rstrip("/\\"))[-1]
    return f"<local>/{name}" if name and not name.startswith(("~", "file:")) and not name.endswith(":") else "<local>"


# ------------------------------------------------------------------ model card
def _fmt(x, digits: int = 3) -> str:
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def model_card(cfg, meta: dict, target: str | None, repo_id: str, dtype: str, bench: dict | None,
               base_model: str | None = None) -> str:
    """The README.md card; `base_model` (a hub id) names the target where `target` is a local path."""
    kind = kind_of(cfg)
    base = base_model or base_model_id(target)
    local = scrub_paths(target)
    front = {"license": meta.get("license", "apache-2.0"), "library_name": "specheads",
             "pipeline_tag": "text-generation", "tags": [kind.name, *TAGS]}
    if base:
        front = {"base_model": base, **front}
    target_text = (f"[`{base}`](https://huggingface.co/{base})" if base
                   else f"`{local}` (a local checkpoint)" if local else "an unrecorded target")
    serve_target = base or TARGET_PLACEHOLDER
    architectures = ", ".join(f"`{a}`" for a in kind.architectures()) or kind.name
    head_rows = kind.card_head(cfg, dtype) if kind.card_head else [f"| architecture | {architectures}, dtype {dtype} |"]
    lines = [
        "---", yaml.safe_dump(front, sort_keys=False).strip(), "---", "",
        f"# {kind.title} draft head for {base or (f'`{local}`' if local else 'its target')}", "",
        f"A speculative-decoding draft head ({kind.title}) for {target_text}, trained with "
        "specheads. The head proposes tokens and the target verifies them, so the "
        "output is the target's own (greedy output equals plain decoding).", "",
        "## Head", "",
        "| | |", "|---|---|",
        f"| target | {target_text} |",
        *head_rows, "",
    ]
    lines += _training_section(meta) + _acceptance_section(meta) + _bench_section(bench)
    lines += ["## Use", ""]
    if not base:
        trained_on = f"a local checkpoint, `{local}`" if local else "not recorded"
        lines += [f"Replace `{TARGET_PLACEHOLDER}` below with the target this head was trained for "
                  f"({trained_on}): its hub id or a local Hugging Face checkpoint folder.", ""]
    lines += [
        "specheads (lossless speculative decoding on one GPU or CPU):", "",
        f"    specheads generate --target {serve_target} --draft {repo_id} --prompt \"Hello\"",
        f"    specheads serve --target {serve_target} --draft {repo_id}", "",
    ]
    tree = meta.get("tree") or {}
    if tree.get("num_steps"):  # recorded by `specheads evaluate --save-tree`
        how = tree.get("chosen_on") or {}
        lines += [f"specheads drafts with this head's own tree by default: {tree['num_steps']} steps, topk "
                  f"{tree['topk']}, {tree['num_draft_tokens']} draft tokens, the fastest of "
                  f"{len(how.get('candidates') or {}) or 'the'} trees measured on the evaluation suite's "
                  f"{how.get('split', 'validation')} split ({_fmt(how.get('speedup'), 2)}x plain decoding on "
                  f"average{', ' + how['card'] if how.get('card') else ''}). `--num-steps`, `--topk` and "
                  "`--num-draft-tokens` override it.", ""]
    refused = getattr(cfg, "refused_exports", dict)()  # engines whose loader does not take this head's shape
    for fmt, command in kind.launch.items():
        if fmt in refused:
            continue
        lines += [f"{ENGINES.get(fmt, fmt)}:", "", "    " + command.format(target=serve_target, folder=repo_id), ""]
    return "\n".join(lines)


def _training_section(meta: dict) -> list[str]:
    data, train, run = meta.get("data") or {}, meta.get("train") or {}, (meta.get("run_config") or {}).get("train", {})
    if not data and not train:
        return ["## Training", "", "Not recorded (the folder has no specheads.json training metadata).", ""]
    lines = ["## Training", ""]
    if data:
        conv = data.get("conversations", {})
        lines.append(
            f"- data: `{data.get('data', 'unknown')}`, {conv.get('train', '?')} train / {conv.get('eval', '?')} "
            f"held-out conversations, {data.get('train_tokens', '?')} train tokens "
            f"({data.get('train_loss_tokens', '?')} in the loss), max length {data.get('max_length', '?')}, "
            + ("answers regenerated by the target itself" if data.get("regenerated") else "answers as in the data"))
    if train:
        lines.append(f"- {train.get('steps', '?')} optimizer steps in {train.get('train_wall_s', '?')} s on "
                     f"{train.get('world_size', 1)} x {train.get('device', '?')}, {train.get('tokens', '?')} tokens")
    if run:
        lines.append(f"- TTT steps {run.get('ttt_steps', '?')}, lr {run.get('lr', '?')}, batch size "
                     f"{run.get('batch_size', '?')} x grad accum {run.get('grad_accum', 1)}, "
                     f"epochs {run.get('epochs', '?')}"
                     + (f", starting from an earlier head (`{scrub_paths(run['init_from'])}`)" if run.get("init_from")
                        else ""))
    gguf = next((t for t in (meta.get("target"), data.get("target")) if isinstance(t, str)
                 and t.lower().endswith(".gguf")), None)
    if gguf:  # the head learned the dequantized weights' hidden states, not the original checkpoint's
        lines.append(f"- target: dequantized from the GGUF file `{Path(gguf).name}` on load; the head was trained "
                     "on that model's hidden states, which differ slightly from the original checkpoint's, so "
                     "acceptance with the original weights can differ a little")
    return lines + [""]


def _acceptance_section(meta: dict) -> list[str]:
    train = meta.get("train") or {}
    acc, chain, length = train.get("eval/acc"), train.get("eval/chain_acc"), train.get("eval/accept_length")
    lines = ["## Measured acceptance (held-out conversations)", ""]
    if not acc:
        return lines + ["Not measured: specheads.json holds no eval metrics.", ""]
    lines += ["| draft step | top-1 accuracy vs target | chain accuracy (greedy) |", "|---|---|---|"]
    for k, a in enumerate(acc):
        lines.append(f"| {k} | {_fmt(a)} | {_fmt(chain[k]) if chain and k < len(chain) else 'not measured'} |")
    lines += ["", f"Simulated greedy chain acceptance length: {_fmt(length) if length is not None else 'not measured'}"
              + (f" over {train['eval/positions']} positions." if train.get("eval/positions") else ".")]
    opening = train.get("eval/accept_length_opening")
    if opening is not None:  # what a chat user meets first; long answers of small models loop, and loops are easy
        lines.append(f"Over the first 256 tokens of first answers: {_fmt(opening)}"
                     + (f" ({train['eval/positions_opening']} positions)." if train.get("eval/positions_opening")
                        else "."))
    return lines + [""]


def _bench_section(bench: dict | None) -> list[str]:
    lines = ["## Decoding benchmark", ""]
    if bench and bench.get("categories"):
        return lines + _suite_rows(bench)
    if not bench or not bench.get("rows"):
        return lines + ["Not measured (publish with `--bench` and the JSON of `scripts/bench.py` or of "
                        "`specheads evaluate` to add it).", ""]
    lines += [f"`scripts/bench.py` on {bench.get('card', '?')}, {bench.get('dtype', '?')}, "
              f"{bench.get('max_new_tokens', '?')} new tokens, {bench.get('date', '?')}, draft as benchmarked "
              f"`{bench.get('draft', '?')}`:", "",
              "| prompts | batch | method | tokens/s | mean accept length | speedup vs ar |",
              "|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        accept = r.get("mean_accept_length")
        lines.append(f"| {r.get('prompts', '?')} | {r.get('batch', '?')} | {r.get('method', '?')} | "
                     f"{_fmt(r.get('tokens_per_s'), 1)} | {_fmt(accept, 2) if accept is not None else '-'} | "
                     f"{_fmt(r['speedup_vs_ar'], 2) if r.get('speedup_vs_ar') is not None else '-'} |")
    return lines + [""]


def _suite_rows(suite: dict) -> list[str]:
    """The evaluation suite's JSON (`specheads evaluate --out`): a row per category and method."""
    methods = [m["name"] for m in suite.get("methods", []) if m.get("name") != "ar"]
    lines = [f"`specheads evaluate` ({suite.get('split', '?')} split) on {suite.get('card', '?')}, "
             f"{str(suite.get('dtype', '?')).replace('torch.', '')}, batch {suite.get('batch_size', '?')}, "
             f"{suite.get('max_new_tokens', '?')} new tokens, greedy, {suite.get('date', '?')}; acceptance = "
             "tokens a verify step emits, speedup = tokens/s over plain decoding of the same prompts:", "",
             "| category | prompts | plain tokens/s | " + " | ".join(f"{m} accept | {m} speedup" for m in methods) + " |",
             "|---|---|---|" + "---|---|" * len(methods)]

    def cells(row: dict) -> str:
        return " | ".join(f"{_fmt((row.get(m) or {}).get('mean_accept_length'), 2)} | "
                          f"{_fmt((row.get(m) or {}).get('speedup_vs_ar'), 2)}x" for m in methods)

    for name, row in suite["categories"].items():
        ar = row.get("ar") or {}
        lines.append(f"| {name} | {ar.get('prompts', '?')} | {_fmt(ar.get('tokens_per_s'), 0)} | {cells(row)} |")
    if suite.get("chat_macro_average"):
        lines.append(f"| chat (mean of the non-coding categories) | | | {cells(suite['chat_macro_average'])} |")
    return lines + [""]


# ------------------------------------------------------------------ upload
def _saved_token() -> str | None:
    from huggingface_hub import get_token

    return get_token()  # HF_TOKEN, then the token `huggingface-cli login` saved


def git_blob_sha1(path: Path) -> str:
    """The git object id the Hub reports for a regular (non-LFS) file."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def remote_differences(siblings, stage: Path, files: dict[str, int]) -> list[str]:
    """The staged files that the remote repo lacks or holds with other content."""
    remote = {s.rfilename: s for s in siblings}
    differs = []
    for name in files:
        s = remote.get(name)
        if s is None:
            differs.append(f"{name} (missing)")
        elif s.lfs is not None and s.lfs.sha256 != sha256(stage / name):
            differs.append(name)
        elif s.lfs is None and s.blob_id != git_blob_sha1(stage / name):
            differs.append(name)
    return differs


def _upload(stage: Path, files: dict[str, int], source: str, repo_id: str, private: bool, revision: str, token: str,
            commit_message: str, force: bool, base_model: str | None) -> PublishResult:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    api = HfApi(token=token)
    where = f"{repo_id}@{revision}"
    try:
        try:
            siblings = api.model_info(repo_id, revision=revision, files_metadata=True).siblings or []
        except RepositoryNotFoundError:
            siblings = None  # a new repo
        except RevisionNotFoundError:
            siblings = []  # the repo exists, the branch does not yet
        ours = [s for s in siblings or [] if s.rfilename != ".gitattributes"]
        differs = remote_differences(ours, stage, files) if ours else []
        if ours and not differs:
            return PublishResult(stage, files, "up-to-date", f"{api.endpoint}/{repo_id}", base_model=base_model)
        if differs and not force:
            raise HubError(f"{where} already holds other content ({', '.join(differs)} differ from what {source!r} "
                           "gives); pass --force to overwrite, or choose another --repo-id")
        api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
        if revision != "main":
            api.create_branch(repo_id, branch=revision, exist_ok=True)
        commit = api.upload_folder(folder_path=str(stage), repo_id=repo_id, revision=revision, repo_type="model",
                                   commit_message=commit_message)
    except HfHubHTTPError as e:  # a bad token, no write access, the Hub down: one line naming the repo
        raise HubError(f"publishing to {where} failed: {str(e).splitlines()[0]}") from None
    return PublishResult(stage, files, "uploaded", commit.commit_url, differs, base_model)
