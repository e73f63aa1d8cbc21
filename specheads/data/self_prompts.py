"""Prompts written by the target itself, for data the target then answers (`prepare --regenerate`).

An instruction-tuned model given its chat template up to the start of a user turn (the system
turn, then the user header) writes a user's message: the approach of Magpie (Xu et al., 2024,
"Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing"). Sampled
at temperature 1, the prompts come from the target's own idea of what users ask, so a draft head
trained on its answers to them learns the target where the target goes; any number of them can
be drawn, where the packaged prompt sets run out.

Each prompt is sampled with a seed of its own (the run's seed and its index), and the work is saved
a chunk at a time (`chunk-NNNNN.jsonl.gz`, each written whole): a run that was stopped continues
where it stood, and the same settings write the same prompts. The run's file, `prompts.jsonl.gz`
(rows `{"id", "messages": [one user turn]}`, what `prepare --data` reads), keeps a prompt only if:
its turn ended (the target wrote its end-of-turn token within `max_tokens`); it has at least
`min_words` words; no earlier prompt was the same text (case and spacing aside); and it shares no
word 8-gram with the evaluation suite (its prompts stay unseen). `info.json` counts what was kept
and why the rest was dropped.

    specheads self-prompts --target T --out DIR --count 20000 [--seed 0] [--temperature 1.0]
    specheads prepare --data DIR/prompts.jsonl.gz --regenerate ...
"""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from specheads.data.sources import DataError
from specheads.files import write_text

FORMAT = "specheads-self-prompts/1"
PROMPTS_FILE = "prompts.jsonl.gz"
INFO_FILE = "info.json"
SETTINGS_FILE = "settings.json"
_SENTINEL = "\u0000specheads-user-turn\u0000"


@dataclass(frozen=True)
class SelfPromptSettings:
    count: int = 1000  # prompts sampled (those kept are fewer)
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256  # a prompt longer than this is dropped (its turn did not end)
    min_words: int = 3
    system: str | None = None  # a system turn of the run's own; None: the template's default
    chunk: int = 512  # prompts a saved chunk holds

    def check(self) -> None:
        if self.count < 1:
            raise DataError(f"self-prompts: count {self.count} must be at least 1")
        if not self.temperature > 0:
            raise DataError(f"self-prompts: temperature {self.temperature} must be above 0 (at 0 every prompt "
                            "would be the same text); 1.0 samples the target's own distribution")
        if not 0 < self.top_p <= 1:
            raise DataError(f"self-prompts: top_p {self.top_p} must lie in (0, 1]")
        if self.max_tokens < 1 or self.chunk < 1 or self.min_words < 0:
            raise DataError("self-prompts: max_tokens and chunk must be at least 1, min_words at least 0")


def user_turn_prefix(tokenizer, system: str | None = None) -> str:
    """The chat template's text up to where a user's message starts (its system turn, default or
    given, and the user header)."""
    from specheads.target.chat import render

    messages = ([{"role": "system", "content": system}] if system is not None else []) + [
        {"role": "user", "content": _SENTINEL}]
    text = render(tokenizer, messages)
    at = text.find(_SENTINEL)
    if at < 0:
        raise DataError("self-prompts: the target's chat template does not show the user's message verbatim, "
                        "so the start of a user turn cannot be found")
    return text[:at]


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _chunk_path(out: Path, k: int) -> Path:
    return out / f"chunk-{k:05d}.jsonl.gz"


def _write_gz_lines(path: Path, rows) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def _read_gz_lines(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _fingerprint(target_id: str, settings: SelfPromptSettings, prefix: str) -> str:
    h = hashlib.sha256(json.dumps([FORMAT, target_id, asdict(settings), prefix], sort_keys=True).encode())
    return h.hexdigest()[:16]


def sample_chunk(engine, tokenizer, prefix_ids: list[int], settings: SelfPromptSettings, start: int,
                 stop: int) -> list[dict]:
    """Prompts start..stop-1, each sampled with its own seed: {"index", "text", "ended"}."""
    from specheads.runtime.sampling import SamplingParams
    from specheads.target.chat import stop_token_ids

    n = stop - start
    # generate() seeds prompt i of a call with seed + 1_000_003 * i, so prompt j of the run gets
    # run_base + 1_000_003 * j whatever the chunks (the noise reads a seed's low 32 bits: distinct
    # for every j below 2**32, the multiplier being odd)
    run_base = (settings.seed * 0x9E3779B1) % 2**32
    params = SamplingParams(temperature=settings.temperature, top_p=settings.top_p,
                            max_new_tokens=settings.max_tokens, seed=run_base + 1_000_003 * start)
    results = engine.generate([prefix_ids] * n, params, stop_token_ids(tokenizer))
    return [{"index": start + i, "text": tokenizer.decode(r.token_ids, skip_special_tokens=True).strip(),
             "ended": r.finish_reason == "stop"} for i, r in enumerate(results)]


def keep_prompts(samples: list[dict], settings: SelfPromptSettings, forbidden: set[int],
                 run_id: str) -> tuple[list[dict], Counter]:
    """The rows of the samples that pass the filters (module docstring), and the count dropped by reason."""
    from specheads.evaluation.suite import ngrams

    seen, rows, dropped = set(), [], Counter()
    min_words = max(settings.min_words, 1)
    for s in sorted(samples, key=lambda s: s["index"]):
        text = s["text"]
        if not s["ended"]:
            dropped["the turn did not end within max_tokens"] += 1
        elif len(text.split()) < min_words:
            dropped[f"fewer than {min_words} words"] += 1
        elif _normal(text) in seen:
            dropped["the same text as an earlier prompt"] += 1
        elif not ngrams(text).isdisjoint(forbidden):
            dropped["shares a word 8-gram with the evaluation suite"] += 1
        else:
            seen.add(_normal(text))
            rows.append({"id": f"self-{run_id}-{s['index']}", "messages": [{"role": "user", "content": text}]})
    return rows, dropped


def write_self_prompts(target, out: str | Path, settings: SelfPromptSettings, batch_size: int = 256,
                       device: str | None = None, progress: bool = True) -> dict:
    """Sample `settings.count` prompts from `target` (a folder, hub id or .gguf, as elsewhere), saving
    chunk by chunk under `out`, then write `prompts.jsonl.gz` and `info.json`; returns the info."""
    import torch
    from tqdm.auto import tqdm

    from specheads.data.regenerate import _device_dtype, parse_devices
    from specheads.evaluation.suite import suite_ngrams
    from specheads.runtime.engine import SpecEngine
    from specheads.target.loader import load_target

    settings.check()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = device or parse_devices(None)[0]
    t0 = time.perf_counter()
    model, tokenizer, target_dir = load_target(target, dtype=_device_dtype(device), device=device)
    prefix = user_turn_prefix(tokenizer, settings.system)
    prefix_ids = tokenizer(prefix, add_special_tokens=False)["input_ids"]
    target_id = str(target) if target is not None else "embedded SmolLM2-135M-Instruct"
    run_id = _fingerprint(target_id, settings, prefix)
    saved = out / SETTINGS_FILE
    mine = {"format": FORMAT, "run": run_id, "target": target_id, "settings": asdict(settings), "prefix": prefix}
    if saved.is_file():
        theirs = json.loads(saved.read_text())
        if theirs.get("run") != run_id:
            raise DataError(f"self-prompts: {out} holds a run of other settings or another target "
                            f"({theirs.get('target')}, {theirs.get('settings')}); give another --out, or remove it")
    else:
        write_text(saved, json.dumps(mine, indent=1))
    chunks = [(k, start, min(start + settings.chunk, settings.count))
              for k, start in enumerate(range(0, settings.count, settings.chunk))]
    todo = [c for c in chunks if not _chunk_path(out, c[0]).is_file()]
    engine = None
    if todo:
        cap = min(len(prefix_ids) + settings.max_tokens + 8, model.rotary.max_positions)
        engine = SpecEngine(model, method="ar", max_len=cap, max_batch=min(batch_size, settings.chunk))
    bar = tqdm(total=settings.count, initial=settings.count - sum(stop - start for _, start, stop in todo),
               desc="self-prompts", unit="prompt", disable=not progress)
    for k, start, stop in todo:
        _write_gz_lines(_chunk_path(out, k), sample_chunk(engine, tokenizer, prefix_ids, settings, start, stop))
        bar.update(stop - start)
    bar.close()
    samples = [s for k, _, _ in chunks for s in _read_gz_lines(_chunk_path(out, k))]
    rows, dropped = keep_prompts(samples, settings, suite_ngrams(), run_id)
    if not rows:
        raise DataError(f"self-prompts: none of the {len(samples)} prompts sampled passed the filters "
                        f"({dict(dropped)}); a larger max_tokens or another temperature may help")
    _write_gz_lines(out / PROMPTS_FILE, rows)
    words = sorted(len(r["messages"][0]["content"].split()) for r in rows)
    info = {**mine, "target_folder": str(target_dir), "device": device, "sampled": len(samples), "kept": len(rows),
            "dropped": dict(dropped), "words_median": words[len(words) // 2], "seconds": round(time.perf_counter() - t0, 1),
            "file": PROMPTS_FILE}
    write_text(out / INFO_FILE, json.dumps(info, indent=1))
    if engine is not None:
        del engine
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return info
