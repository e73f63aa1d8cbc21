"""Drafters behind one interface (`base`), and the methods that build them.

A method name picks a drafter: "ar" decodes without one; every head kind in
`specheads.heads.registry` is a method (its head's drafter, e.g. "eagle3"); other drafters
register a builder with `register_method` ("ngram" and "ngram-host" are built in).

    from specheads.drafters import DraftSetup, Drafter, register_method

    class Mine(Drafter):
        ...

    register_method("mine", lambda setup: Mine(setup.num_draft_tokens))
    SpecEngine(target, method="mine")
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult

__all__ = ["Abilities", "DraftContext", "DraftSetup", "Drafter", "DrafterError", "Needs", "PrefillBatch", "StepResult",
           "build_drafter", "method_names", "method_needs_head", "register_method",
           "unregister_method"]

PLAIN = "ar"  # decoding without a drafter


class DrafterError(ValueError):
    pass


@dataclass
class DraftSetup:
    """What a method's builder gets: the target, the head (methods that need one), the tree
    options and any drafter-specific options (e.g. {"lm_head_int8": False})."""

    target: object
    head: object = None
    num_steps: int = 6
    topk: int = 4
    num_draft_tokens: int = 15
    static_tree: object = None
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class _Method:
    build: Callable[[DraftSetup], Drafter]
    needs_head: bool
    about: str


_METHODS: dict[str, _Method] = {}


def register_method(name: str, build: Callable[[DraftSetup], Drafter], *, needs_head: bool = False,
                    about: str = "", replace: bool = False) -> None:
    """Make `name` a method: `build(setup)` returns its drafter."""
    if name == PLAIN or (name in _METHODS and not replace):
        raise DrafterError(f"method {name!r} is already registered")
    _METHODS[name] = _Method(build, needs_head, about)


def unregister_method(name: str) -> None:
    _METHODS.pop(name, None)


def _head_kinds() -> list[str]:
    registry = importlib.import_module("specheads.heads.registry")
    return list(registry.head_kinds())


def method_names() -> list[str]:
    """Every method: plain decoding, the registered drafters, then each head kind."""
    return [PLAIN] + list(_METHODS) + [k for k in _head_kinds() if k not in _METHODS]


def method_needs_head(method: str | None) -> bool:
    """Whether a method drafts with a head (None: the default, a head's kind when one is given)."""
    if method is None:
        return True
    if method in _METHODS:
        return _METHODS[method].needs_head
    return method != PLAIN and method in _head_kinds()


def build_drafter(method: str, setup: DraftSetup) -> Drafter | None:
    """The drafter of a method (None for plain decoding)."""
    if method == PLAIN:
        return None
    if method in _METHODS:
        m = _METHODS[method]
        if m.needs_head and setup.head is None:
            raise DrafterError(f"method {method} needs a draft head (--draft)")
        return m.build(setup)
    if method in _head_kinds():
        if setup.head is None:
            raise DrafterError(f"method {method} needs a draft head (--draft)")
        kind = getattr(setup.head, "kind", None)
        if kind != method:
            raise DrafterError(f"method {method} needs a {method} head; the head given is of kind {kind!r}")
        registry = importlib.import_module("specheads.heads.registry")
        return registry.drafter_class(registry.head_kind(kind)).from_setup(setup)
    raise DrafterError(f"method {method!r} is not one of {', '.join(method_names())}")


def _ngram(setup: DraftSetup) -> Drafter:
    from specheads.drafters.ngram import DeviceNgramDrafter
    return DeviceNgramDrafter(setup.num_draft_tokens, **setup.options)


def _ngram_host(setup: DraftSetup) -> Drafter:
    from specheads.drafters.ngram import NgramDrafter
    return NgramDrafter(setup.num_draft_tokens, **setup.options)


register_method("ngram", _ngram, about="prompt lookup: the tokens after the latest earlier match of the history's suffix")
register_method("ngram-host", _ngram_host, about="ngram's lookup on the host (the same drafts; its reference)")


def _draft_model(setup: DraftSetup) -> Drafter:
    # resolved by name when used, as head kinds' drafters are (the module imports this package)
    return importlib.import_module("specheads.drafters.draft_model").DraftModelDrafter.from_setup(setup)


register_method("draft_model", _draft_model, needs_head=True,
                about="a standalone small LM of the target's family (same tokenizer), with its own KV cache")
