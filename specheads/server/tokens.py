"""Token ids -> text deltas as they arrive, cut at stop strings.

A token can end in the middle of a UTF-8 character (byte-level BPE) and a word-piece
tokenizer needs the previous token to know whether a space leads: each delta decodes a
short window of earlier tokens and keeps only what the window did not already show, and
waits while the text ends in U+FFFD (an incomplete character).
"""

from __future__ import annotations


class Detokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # window start: context for the next decode
        self.read = 0  # tokens already turned into text

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        shown = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) <= len(shown) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(shown):]

    def flush(self) -> str:
        """What the last tokens hold even if a character stays incomplete."""
        shown = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(shown):]


class StopMatcher:
    """Holds back the last len(longest stop) - 1 characters so that a stop string split
    across deltas is never sent; `push` returns (text safe to send, stopped)."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.keep = max((len(s) for s in self.stops), default=1) - 1
        self.held = ""

    def push(self, delta: str) -> tuple[str, bool]:
        text = self.held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.held = ""
            return text[:cut], True
        split = max(len(text) - self.keep, 0)
        self.held = text[split:]
        return text[:split], False

    def flush(self) -> str:
        text, self.held = self.held, ""
        return text
