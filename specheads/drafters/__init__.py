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
from dataclasses import dataclass, field, replace
from typing import Callable

from specheads.drafters.base import Abilities, DraftContext, Drafter, Needs, PrefillBatch, StepResult

__all__ = ["Abilities", "DraftContext", "DraftSetup", "Drafter", "DrafterError", "Needs", "PrefillBatch", "StepResult",
           "build_drafter", "default_method", "method_names", "method_needs_head", "register_method",
           "unregister_method"]

PLAIN = "ar"  # decoding without a drafter


class DrafterError(ValueError):
    pass


@dataclass
class DraftSetup:
    """What a method's builder gets: the target, the head (methods that need one), the tree
    options, any drafter-specific options (e.g. {"lm_head_int8": False}), the speculation policy
    the engine runs ("fixed", "adaptive"; None where no engine says) and the positions a step may
    reach past the engine's longest sequence (None: no limit): the n-gram assist's gate and its
    chain take their defaults by these (drafters/assist.py)."""

    target: object
    head: object = None
    num_steps: int = 6
    topk: int = 4
    num_draft_tokens: int = 15
    static_tree: object = None
    options: dict = field(default_factory=dict)
    policy: str | None = None
    room: int | None = None


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
    """Every method: plain decoding, the registered drafters, then each head kind (each of those
    also as KIND+ngram: drafters/assist.py)."""
    return [PLAIN] + list(_METHODS) + [k for k in _head_kinds() if k not in _METHODS]


def default_method(head) -> str:
    """The method a head drafts with when none is named: its kind's (`HeadKind.default_method`: the
    kind, or KIND+ngram where the kind drafts with the n-gram assist); `ar` without a head."""
    kind = getattr(head, "kind", None) if head is not None else None
    if kind is None:
        return PLAIN
    registry = importlib.import_module("specheads.heads.registry")
    return registry.head_kind(kind).default_method if kind in registry.head_kinds() else kind


def method_needs_head(method: str | None) -> bool:
    """Whether a method drafts with a head (None: the default, a head's kind when one is given)."""
    if method is None:
        return True
    method = _assist().split_method(method)[0]
    if method in _METHODS:
        return _METHODS[method].needs_head
    return method != PLAIN and method in _head_kinds()


def parse_options(text: str) -> dict:
    """'ngram_gate=1,lm_head_int8=false' -> {'ngram_gate': 1, 'lm_head_int8': False}: a method's drafter
    options written after its name (integers, true/false, or text)."""
    out = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        key, eq, value = item.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise DrafterError(f"drafter option {item!r}: expected name=value, e.g. ngram_gate=1")
        value = value.strip()
        if ":" in value:  # (a second option joined with ':' would reach the drafter as this one's value)
            raise DrafterError(f"drafter option {item!r}: a value holds ':'; separate options with ',', e.g. "
                               f"ngram_gate_chain=47,ngram_max=6")
        low = value.lower()
        out[key.strip()] = (int(value) if value.lstrip("-").isdigit() else
                            low == "true" if low in ("true", "false") else value)
    return out


def _assist():
    return importlib.import_module("specheads.drafters.assist")


def build_drafter(method: str, setup: DraftSetup) -> Drafter | None:
    """The drafter of a method (None for plain decoding). KIND+ngram: KIND's drafter with the
    n-gram lookup beside it (drafters/assist.py; options ngram_max, ngram_min, ngram_gate,
    ngram_gate_chain, ngram_gate_long)."""
    assist = _assist()
    base, assisted = assist.split_method(method)
    if assisted:
        if base == PLAIN or base not in method_names():
            raise DrafterError(f"method {method!r}: {base!r} is not a method to assist with n-gram lookup; "
                               f"write KIND+ngram with KIND one of {', '.join(m for m in method_names() if m != PLAIN)}")
        inner = build_drafter(base, replace(setup, options={k: v for k, v in setup.options.items()
                                                            if k not in assist.OPTIONS}))
        try:
            options = assist.resolve_options({k: v for k, v in setup.options.items() if k in assist.OPTIONS},
                                             setup.policy, setup.room)
            return assist.NgramAssist(inner, options.get("ngram_max", assist.MAX_NGRAM),
                                      options.get("ngram_min", assist.MIN_NGRAM), gate=options.get("ngram_gate", assist.GATE),
                                      gate_chain=options.get("ngram_gate_chain") or 0,
                                      gate_long=options.get("ngram_gate_long"))
        except (ValueError, NotImplementedError) as e:
            raise DrafterError(f"method {method}: {e}") from None
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
