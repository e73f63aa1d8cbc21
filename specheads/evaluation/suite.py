"""The frozen evaluation suite: prompts by category, each with a validation and a test part.

The prompts come from published sets shipped in PyPI packages and from the team (see
scripts/build_eval_suite.py, which builds data/suite.jsonl.gz and lists every source with its
license); none shares a word 8-gram with the training data. The validation part is for
choosing tree shapes, data mixes and hyperparameters; the test part is only reported.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path

SUITE_FILE = Path(__file__).parent / "data" / "suite.jsonl.gz"
CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities", "multi-turn")
# "chat" in the results is the macro-average over these (every category but coding)
CHAT_CATEGORIES = tuple(c for c in CATEGORIES if c != "coding")
SPLITS = ("validation", "test")


@dataclass(frozen=True)
class EvalPrompt:
    id: str
    category: str
    split: str
    turns: tuple[str, ...]  # the user turns; a multi-turn prompt is measured on its last
    source: str
    license: str
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def text(self) -> str:
        """The first user turn."""
        return self.turns[0]


class SuiteError(ValueError):
    pass


def load_suite(split: str = "test", categories=None, path: Path | None = None, limit: int | None = None) -> list[EvalPrompt]:
    """The suite's prompts of one split ('validation', 'test' or 'all'), in file order; with
    `limit`, the first that many of each category (categories in file order)."""
    if split not in SPLITS + ("all",):
        raise SuiteError(f"split {split!r} is not one of validation, test, all")
    wanted = tuple(categories) if categories else CATEGORIES
    unknown = [c for c in wanted if c not in CATEGORIES]
    if unknown:
        raise SuiteError(f"unknown categories {unknown}; the suite has {', '.join(CATEGORIES)}")
    with gzip.open(path or SUITE_FILE, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = []
    for r in rows:
        if r["category"] in wanted and (split == "all" or r["split"] == split):
            core = {"id", "category", "split", "turns", "source", "license"}
            out.append(EvalPrompt(r["id"], r["category"], r["split"], tuple(r["turns"]), r["source"], r["license"],
                                  {k: v for k, v in r.items() if k not in core}))
    if limit:
        out = [p for c in dict.fromkeys(p.category for p in out) for p in [q for q in out if q.category == c][:limit]]
    return out


def single_turn_texts(split: str, categories, n: int | None = None) -> list[str]:
    """The first turns of the single-turn prompts of these categories, the categories taken in
    turn (a cut of n is then spread over them, not the first category's alone)."""
    cats = list(categories)
    prompts = [p for p in load_suite(split, cats) if len(p.turns) == 1]
    by_cat = [[p.turns[0] for p in prompts if p.category == c] for c in cats]
    texts = [t for group in zip_longest(*by_cat) for t in group if t is not None]
    return texts if n is None else texts[:n]


_WORD = re.compile(r"[a-z0-9]+")


def ngrams(text: str, n: int = 8) -> set[int]:
    """Hashed word n-grams of a text (lowercase alphanumeric words), for overlap checks
    within one process."""
    words = _WORD.findall(text.lower())
    return {hash(tuple(words[i: i + n])) for i in range(len(words) - n + 1)}


def suite_ngrams(path: Path | None = None) -> set[int]:
    """The word 8-grams of every turn of every prompt of the suite (both splits): what training
    data must not share."""
    return {g for p in load_suite("all", path=path) for turn in p.turns for g in ngrams(turn)}


def loop_share(tokens: list[int], n: int = 32) -> float:
    """The share of tokens that lie inside an n-gram occurring at least twice in `tokens`: a
    looping answer is easy to draft and inflates acceptance."""
    if len(tokens) < n:
        return 0.0
    first: dict[tuple, int] = {}
    repeated = [False] * len(tokens)
    starts = []
    for i in range(len(tokens) - n + 1):
        g = tuple(tokens[i: i + n])
        if g in first:
            starts.append(first[g])
            starts.append(i)
        else:
            first[g] = i
    for s in set(starts):
        for j in range(s, s + n):
            repeated[j] = True
    return sum(repeated) / len(tokens)
