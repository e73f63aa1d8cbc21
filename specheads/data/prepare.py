"""prepare: conversations -> chat template -> input_ids + loss_mask -> an on-disk dataset.

Output folder: a `datasets.DatasetDict` (train / eval) saved with `save_to_disk`, plus
`vocab_map.safetensors` (d2t, t2d, token counts) and `prepare_report.json`; with
`--regenerate` also `regenerated.jsonl.gz`, the conversations as the target answered them
(one {id, messages} a line), which `prepare --data` takes again without regenerating.
The eval split is fixed by a hash of each conversation's id (in a mix, of its id in its source:
`Conversation.key`), so it does not move when `--limit`, the data order or the mix changes.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from specheads.data.chat import cut_loops, tokenize_conversation
from specheads.data.mix import check_sources, mix_conversations, parse_sources, realised_mix
from specheads.data.sources import DataError, SkipLog, check_data_source, read_conversations
from specheads.data.vocab import VOCAB_FILE, build_vocab_map, save_vocab_map, token_frequencies

REPORT_FILE = "prepare_report.json"
REGENERATED_FILE = "regenerated.jsonl.gz"


@dataclass
class PrepareOptions:
    target: str | None = None
    data: str = "sharegpt"
    # a mix of several sources ([{name, ratio, path?}], data.sources of a run config; see data.mix):
    # replaces `data` where it holds more than one source
    sources: list[dict] | None = None
    mix_seed: int = 0  # which conversations a mix draws, and their order
    output: str = "data/smollm2"
    max_length: int = 2048
    limit: int | None = None
    eval_fraction: float = 0.02
    draft_vocab_size: int = 32000
    regenerate: bool = False
    regen_max_new_tokens: int = 512
    regen_temperature: float = 0.0
    regen_top_p: float = 1.0
    regen_seed: int = 0
    regen_batch_size: int = 64
    regen_max_turns: int | None = None
    cut_loops: int | None = None  # cut each assistant answer after its first repeated n-gram of this length
    devices: str | None = None  # regeneration: None (one: cuda if any), "all", "4", "cuda:0,cuda:1", "cpu"
    # processes that tokenize (the chat template renders in Python: ~10 ms a conversation);
    # None: the CPUs this process may use, at most 16
    num_proc: int | None = None


def is_eval(conv_id: str, fraction: float) -> bool:
    h = int(hashlib.sha1(conv_id.encode()).hexdigest()[:8], 16)
    return h < fraction * 0xFFFFFFFF


def write_conversations(path: Path, conversations) -> None:
    """{id, messages} JSON lines, gzip (written aside, then moved into place: files.open_aside); a
    conversation whose split key is not its id (drawn by a mix) keeps it as `split_key`."""
    from specheads.files import open_aside

    with open_aside(path) as f:
        for c in conversations:
            key = {"split_key": c.split_key} if c.split_key and c.split_key != c.id else {}
            f.write(json.dumps({"id": c.id, **key, "messages": c.messages}, ensure_ascii=False) + "\n")


_WORKER_TOKENIZER = None
# a worker process pays ~1 s to start and load the tokenizer: one per this many conversations at most
CONVS_PER_PROC = 256


def default_num_proc() -> int:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, 16))


def tokenize_one(tokenizer, messages: list[dict], max_length: int, loops_n: int | None):
    """One conversation -> ((ids, mask, truncated) or the reason it is skipped, answers cut,
    tokens removed)."""
    n_cut = n_removed = 0
    if loops_n:
        messages, n_cut, n_removed = cut_loops(tokenizer, messages, loops_n)
    try:
        ids, mask, was_truncated = tokenize_conversation(tokenizer, messages, max_length)
    except DataError as e:
        return str(e), n_cut, n_removed
    if sum(mask) == 0:
        return f"no assistant tokens within max_length {max_length}", n_cut, n_removed
    return (ids, mask, was_truncated), n_cut, n_removed


def _worker_init(target_dir: str) -> None:
    global _WORKER_TOKENIZER
    from specheads.target.loader import load_tokenizer

    _WORKER_TOKENIZER = load_tokenizer(Path(target_dir))


def _worker_tokenize(job):
    return tokenize_one(_WORKER_TOKENIZER, *job)


def tokenize_all(target_dir: Path, tokenizer, conversations, opts: PrepareOptions):
    """tokenize_one over every conversation, in order: in this process, or on `opts.num_proc`
    worker processes (each loads the tokenizer once; rendering the chat template per turn is
    the slow part of prepare, ~10 ms a conversation)."""
    jobs = ((c.messages, opts.max_length, opts.cut_loops) for c in conversations)
    bar = dict(total=len(conversations), desc="tokenize", unit="conv")
    workers = min(opts.num_proc or default_num_proc(), max(1, len(conversations) // CONVS_PER_PROC))
    if workers <= 1:
        yield from tqdm((tokenize_one(tokenizer, *job) for job in jobs), **bar)
        return
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(workers, initializer=_worker_init, initargs=(str(target_dir),)) as pool:
        yield from tqdm(pool.imap(_worker_tokenize, jobs, chunksize=64), **bar)


def prepare(opts: PrepareOptions) -> dict:
    from datasets import Dataset, DatasetDict

    from specheads.target.loader import load_tokenizer, resolve_target

    if opts.max_length < 16:
        raise DataError(f"max_length must be >= 16, got {opts.max_length}")
    if opts.cut_loops is not None and opts.cut_loops < 4:
        raise DataError(f"cut_loops must be an n-gram length >= 4 (e.g. 32), got {opts.cut_loops}")
    if opts.num_proc is not None and opts.num_proc < 1:
        raise DataError(f"num_proc must be >= 1, got {opts.num_proc}")
    if not 0 <= opts.eval_fraction < 1:
        raise DataError(f"eval_fraction must be in [0, 1), got {opts.eval_fraction}")
    sources = parse_sources(opts.sources) if opts.sources else None
    if sources is not None and len(sources) == 1:  # one source: read as --data reads it, in its own order
        opts.data, sources = sources[0].data, None
    if sources is None:
        check_data_source(opts.data)
    else:
        check_sources(sources)
    if opts.regenerate:
        from specheads.data.regenerate import parse_devices

        devices = parse_devices(opts.devices)
    t0 = time.time()
    phases: dict[str, float] = {}  # seconds of each part, in the report (where a slow prepare spends its time)
    mark = [t0]

    def phase(name: str) -> None:
        now = time.time()
        phases[name] = round(phases.get(name, 0.0) + now - mark[0], 1)
        mark[0] = now

    target_dir = resolve_target(opts.target)
    tokenizer = load_tokenizer(target_dir)
    # the model's vocab may be padded past the tokenizer (Qwen2/3): the vocab map covers the model's
    from transformers import AutoConfig

    vocab_size = max(len(tokenizer), AutoConfig.from_pretrained(target_dir).vocab_size)
    skips = SkipLog()
    mix = None
    if sources is None:
        conversations = list(
            tqdm(read_conversations(opts.data, skips, opts.limit, answered=not opts.regenerate), desc="read",
                 unit="conv", leave=False)
        )
    else:
        conversations, mix = mix_conversations(sources, skips, opts.limit, opts.mix_seed, answered=not opts.regenerate)
    phase("target_and_read")
    if opts.regenerate:
        from specheads.data.regenerate import regenerate_on
        from specheads.runtime.sampling import SamplingParams

        params = SamplingParams(
            temperature=opts.regen_temperature,
            top_p=opts.regen_top_p,
            seed=opts.regen_seed,
            max_new_tokens=opts.regen_max_new_tokens,
        ).validate()
        before = len(conversations)
        t_regen = time.time()
        # saved as it goes: a killed prepare resumes where it stopped (removed once the data is written)
        Path(opts.output).mkdir(parents=True, exist_ok=True)
        conversations = regenerate_on(
            devices, target_dir, conversations, params, opts.max_length, opts.regen_batch_size, opts.regen_max_turns,
            state_dir=opts.output,
        )
        regen_seconds = time.time() - t_regen
        for _ in range(before - len(conversations)):
            skips.skip("regeneration left no assistant turn", "-")
        write_conversations(Path(opts.output) / REGENERATED_FILE, conversations)
        phase("regenerate")
    splits = {"train": {"input_ids": [], "loss_mask": [], "id": []}, "eval": {"input_ids": [], "loss_mask": [], "id": []}}
    truncated = 0
    loops = {"answers_cut": 0, "tokens_removed": 0}
    for conv, (row, n_cut, n_removed) in zip(conversations, tokenize_all(target_dir, tokenizer, conversations, opts)):
        loops["answers_cut"] += n_cut
        loops["tokens_removed"] += n_removed
        if isinstance(row, str):
            skips.skip(row, conv.id)
            continue
        ids, mask, was_truncated = row
        truncated += was_truncated
        split = splits["eval" if is_eval(conv.key, opts.eval_fraction) else "train"]
        split["input_ids"].append(ids)
        split["loss_mask"].append(mask)
        split["id"].append(conv.id)
    phase("tokenize")
    if not splits["train"]["input_ids"]:
        raise DataError(
            f"no usable conversations in data {opts.data!r}: skipped {skips.total} "
            f"({json.dumps(skips.as_dict())[:500]})"
        )
    if not splits["eval"]["input_ids"] and opts.eval_fraction > 0 and len(splits["train"]["id"]) > 1:
        # tiny runs: hold out one conversation so metrics exist
        for key in splits["train"]:
            splits["eval"][key].append(splits["train"][key].pop())
    out = Path(opts.output)
    out.mkdir(parents=True, exist_ok=True)
    # an empty split cannot be saved and loaded back: leave it out
    DatasetDict({k: Dataset.from_dict(v) for k, v in splits.items() if v["input_ids"]}).save_to_disk(str(out))
    phase("save")
    counts = token_frequencies(
        ({"input_ids": i, "loss_mask": m} for i, m in zip(splits["train"]["input_ids"], splits["train"]["loss_mask"])),
        vocab_size,
    )
    draft_vocab_size = min(opts.draft_vocab_size, vocab_size)
    d2t, t2d = build_vocab_map(counts, draft_vocab_size)
    save_vocab_map(out / VOCAB_FILE, d2t, t2d, counts)
    n_tok = sum(len(x) for x in splits["train"]["input_ids"])
    n_loss = sum(sum(x) for x in splits["train"]["loss_mask"])
    covered = float(counts[t2d].sum()) / max(float(counts.sum()), 1.0)
    report = {
        "target": str(opts.target or "smollm2-135m-instruct"),
        "target_dir": str(target_dir),
        "vocab_size": vocab_size,
        "tokenizer_size": len(tokenizer),
        "data": opts.data if mix is None else "+".join(row["label"] for row in mix["sources"]),
        "max_length": opts.max_length,
        "regenerated": opts.regenerate,
        "conversations": {"train": len(splits["train"]["id"]), "eval": len(splits["eval"]["id"])},
        "train_tokens": n_tok,
        "train_loss_tokens": n_loss,
        "truncated": truncated,
        "skipped": skips.as_dict(),
        "skipped_total": skips.total,
        "draft_vocab_size": draft_vocab_size,
        "draft_vocab_coverage": round(covered, 5),
        "seconds": round(time.time() - t0, 1),
    }
    phase("vocab_and_report")
    report["phase_seconds"] = phases
    if mix is not None:
        loss_by_source: dict[str, int] = {}
        for conv_id, m in zip(splits["train"]["id"], splits["train"]["loss_mask"]):
            label = conv_id.split(":", 1)[0]
            loss_by_source[label] = loss_by_source.get(label, 0) + sum(m)
        report["mix"] = realised_mix(mix, {k: v["id"] for k, v in splits.items()}, loss_by_source)
    if opts.cut_loops:
        report["cut_loops"] = {"ngram": opts.cut_loops, **loops}
    if opts.regenerate:
        report["regeneration"] = {
            "max_new_tokens": opts.regen_max_new_tokens,
            "temperature": opts.regen_temperature,
            "seed": opts.regen_seed,
            "devices": devices,
            "seconds": round(regen_seconds, 1),
        }
    (out / REPORT_FILE).write_text(json.dumps(report, indent=2))
    if opts.regenerate:  # the resume state goes once the data is saved
        from specheads.data.regenerate import state_files

        for f in state_files(out):
            f.unlink()
    return report
