"""The head registry: kind name -> `HeadKind` (config, module, training unroll and loss, weight
names and shapes, Hub architectures, export writers, drafter).

Format, trainer, hub, publish and the CLI look kinds up here; `head.kind` (a class attribute
of every head module) selects the entry. Importing this module registers the kinds specheads
ships (`specheads.heads.builtin`). A new kind is one module plus one entry:

    from specheads.heads.registry import HeadKind, register_head_kind

    register_head_kind(HeadKind(
        name="mykind", title="My head", config=MyConfig, module=MyHead,
        unroll=my_unroll, loss=ttt_loss, weights=my_weight_shapes, mismatches=my_mismatches,
        exporters={"vllm": my_vllm_config}, hub_architectures={"vllm": ("MyHeadForCausalLM",)},
        drafter="mypackage.drafter:MyDrafter"))

See `specheads.heads.kind` for what each part must answer.
"""

from __future__ import annotations

import importlib

from specheads.heads.builtin import BUILTIN_KINDS, DEFAULT_KIND
from specheads.heads.kind import HeadKind, HeadKindError

__all__ = ["DEFAULT_KIND", "HeadKind", "HeadKindError", "drafter_class", "head_kind", "head_kinds", "kind_of",
           "register_head_kind", "unregister_head_kind"]

_KINDS: dict[str, HeadKind] = {}


def register_head_kind(kind: HeadKind, *, replace: bool = False) -> HeadKind:
    """Add `kind` (checked: see HeadKind.check); a name already taken is an error unless `replace`."""
    if kind.name in _KINDS and not replace:
        raise HeadKindError(f"head kind {kind.name!r} is already registered (pass replace=True to replace it)")
    _KINDS[kind.name] = kind.check()
    return kind


def unregister_head_kind(name: str) -> None:
    """Remove a kind (no error where it is not registered)."""
    _KINDS.pop(name, None)


def head_kind(name: str) -> HeadKind:
    """The entry of kind `name`."""
    try:
        return _KINDS[name]
    except (KeyError, TypeError):
        raise HeadKindError(f"unknown head kind {name!r}; known kinds: {', '.join(_KINDS)}") from None


def head_kinds() -> tuple[str, ...]:
    """The registered kinds' names, the built-in ones first."""
    return tuple(_KINDS)


def kind_of(obj) -> HeadKind:
    """The entry of a head module (by its `kind`) or of a head config (by its class)."""
    name = getattr(obj, "kind", None)
    if isinstance(name, str):
        return head_kind(name)
    # the most derived registered config class: a kind's config may subclass another's (MTPConfig an Eagle3Config)
    for cls in type(obj).__mro__:
        for kind in _KINDS.values():
            if kind.config is cls:
                return kind
    raise HeadKindError(f"{type(obj).__name__} is neither a head nor the config of a registered head kind "
                        f"({', '.join(_KINDS)})")


def drafter_class(kind: HeadKind | str) -> type:
    """The drafter class of a kind, imported now (kinds name it as 'package.module:Class')."""
    kind = head_kind(kind) if isinstance(kind, str) else kind
    if not kind.drafter:
        raise HeadKindError(f"head kind {kind.name!r} has no drafter")
    module_name, _, attr = kind.drafter.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise HeadKindError(f"head kind {kind.name!r}: its drafter {kind.drafter!r} cannot be imported ({e})") from e


for _kind in BUILTIN_KINDS:
    register_head_kind(_kind)
