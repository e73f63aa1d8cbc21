"""What one kind of draft head is made of: a `HeadKind` entry.

The registry (`specheads.heads.registry`) holds one entry per kind; format, trainer, hub,
publish and the CLI look a kind up there and never name one. This module holds only the
entry's shape, so that a kind's own module can build its entry without importing the
registry.

What the parts of an entry must answer:

config: the config class (a dataclass is simplest).
    cfg.to_dict() -> dict                    specheads.json "config"; resuming a checkpoint compares it
    Config.from_dict(d) -> cfg               back from specheads.json
    cfg.to_hf(dtype, target_name) -> dict    config.json of a saved head folder
    Config.from_hf(raw) -> cfg               a folder without specheads.json (written by another tool)
    Config.for_target(target, draft_vocab_size, layer_ids, **overrides) -> cfg
                                             a fresh head for the trainer (None overrides are ignored)
    cfg.fixed_depth() -> int | None          draft depths fixed by the head's shape (MTP modules, Medusa
                                             heads; None: any depth); the trainer unrolls at least these
    cfg.target_layer_ids                     the target decoder layers whose outputs the head reads
    cfg.draft_vocab_size, cfg.hidden_size    reported by the trainer, compared by `specheads eval`
    cfg.refused_exports() -> {format: why}   optional: formats a head of this config does not export
                                             to (any format, the kind's or not); export raises the reason
module: the nn.Module class, built as module(cfg); its class attribute `kind` is the entry's name.
    .config, set_vocab_map(d2t, t2d), target_rows() (draft id -> target id), draft_to_target(ids),
    readout(hidden, step) -> (features [N, F], weight [Vd, F]) with draft logits = features @ weight.T
    for the unroll's output `step` (heads with one output layer ignore it),
    logits(hidden)
    optional attach_target(target): a head that reads more of the target than its embeddings (EAGLE-1
    reads out through the target's lm_head) gets the target from the trainer and its drafter
unroll(head, embed, input_ids, aux_hidden, steps) -> list of per-step hidden states
    the head over a training batch (embed: token ids -> embeddings; aux_hidden: the target's
    captured layers); what `loss` and the evaluation read.
loss(head, embed, input_ids, loss_mask, aux_hidden, target_hidden, teacher_weight, steps, decay,
     chunk, outputs=...) -> training.ttt.StepStats
    outputs: what `unroll` returned for this batch; decay: step k weighted decay**k, or decay[k]
    where a weight is given per step (training.ttt.depth_weight).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


class HeadFormatError(ValueError):
    """A head folder or tensor set that does not hold the head its config describes (heads.format
    raises it; a kind's importer too, which cannot import heads.format: it imports the registry)."""


class HeadKindError(ValueError):
    """A head kind that is unknown, registered twice, or whose entry does not hold together."""


@dataclass(frozen=True)
class HeadKind:
    name: str  # what `head.kind`, specheads.json "kind", `head.kind` in a run config and --kind say
    title: str  # how cards and messages name the kind, e.g. "EAGLE-3"
    config: type
    module: type
    unroll: Callable
    loss: Callable
    # cfg -> {tensor name: shape}: every tensor of a saved head and nothing else (validation)
    weights: Callable[[Any], dict[str, tuple[int, ...]]]
    # (cfg, target spec) -> what keeps a head of this config from running on that target (empty: it fits)
    mismatches: Callable[[Any, Any], list[str]]
    # export format -> fn(head, dtype, target_name) -> the config.json that engine reads
    exporters: Mapping[str, Callable] = field(default_factory=dict)
    # export format -> the `architectures` of its config.json; a folder without specheads.json is
    # recognized by these names
    hub_architectures: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # the `architectures` of the kind's own folder where no export format writes them (MTP's)
    own_architectures: tuple[str, ...] = ()
    # export format -> fn(specheads.json of the head folder) -> why that folder's training keeps it from
    # that format (None: nothing does), for what its config does not tell (e.g. a trained lm_head)
    export_checks: Mapping[str, Callable[[dict], str | None]] = field(default_factory=dict)
    # export format -> fn(tensors {name: tensor}, cfg) -> the tensors that engine's folder holds, for
    # formats whose names differ from the head's own (the folder then carries no specheads.json)
    tensor_exporters: Mapping[str, Callable] = field(default_factory=dict)
    # (config.json, tensors) -> the head's own tensor names, for a folder in one of the kind's export
    # layouts whose names differ (a tensor exporter's inverse; None: folders hold the head's own names)
    tensor_importer: Callable[[dict, dict], dict] | None = None
    # export format -> the command that serves a head folder in that engine ({target}, {folder})
    launch: Mapping[str, str] = field(default_factory=dict)
    # (cfg, dtype name) -> the model card's lines about the head, after the target row of its
    # table (None: the architecture names and the dtype)
    card_head: Callable[[Any, str], list[str]] | None = None
    # "package.module:Class", imported only when a drafter is built
    drafter: str = ""
    # (num_steps, topk, num_draft_tokens) a head of this kind drafts when its folder names no tree of its
    # own (specheads.json "tree"); None: the runtime's DEFAULT_TREE
    default_tree: tuple[int, int, int] | None = None
    # a head of this kind drafts with the n-gram assist beside it where no method is named (method
    # KIND+ngram, specheads/drafters/assist.py); its drafter must take paths deeper than its own
    ngram_assist: bool = False

    @property
    def default_method(self) -> str:
        """The method a head of this kind drafts with when none is named."""
        return f"{self.name}+ngram" if self.ngram_assist else self.name

    def architectures(self) -> tuple[str, ...]:
        """Every architecture name this kind writes (its own folder's first, then in export-format order),
        without repeats."""
        return tuple(dict.fromkeys([*self.own_architectures,
                                    *(a for names in self.hub_architectures.values() for a in names)]))

    def check(self) -> "HeadKind":
        """The entry holds together: raises HeadKindError naming what does not."""
        problems = []
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            problems.append(f"name {self.name!r} is not a word (letters, digits, '-', '_')")
        if getattr(self.module, "kind", None) != self.name:
            problems.append(f"module {self.module.__name__}.kind is {getattr(self.module, 'kind', None)!r}, "
                            f"expected {self.name!r}")
        if set(self.exporters) != set(self.hub_architectures):
            problems.append(f"export formats {sorted(self.exporters)} and hub_architectures' formats "
                            f"{sorted(self.hub_architectures)} differ")
        if set(self.tensor_exporters) - set(self.exporters):
            problems.append(f"tensor exporters for {sorted(set(self.tensor_exporters) - set(self.exporters))}, which "
                            f"are not export formats ({sorted(self.exporters)})")
        if set(self.export_checks) - set(self.exporters):
            problems.append(f"export checks for {sorted(set(self.export_checks) - set(self.exporters))}, which are "
                            f"not export formats ({sorted(self.exporters)})")
        if set(self.launch) - set(self.exporters):
            problems.append(f"launch commands for {sorted(set(self.launch) - set(self.exporters))}, which are not "
                            f"export formats ({sorted(self.exporters)})")
        if self.default_tree is not None and (len(self.default_tree) != 3 or min(self.default_tree) < 1):
            problems.append(f"default_tree {self.default_tree!r} is not (num_steps, topk, num_draft_tokens), each >= 1")
        if self.drafter and self.drafter.count(":") != 1:
            problems.append(f"drafter {self.drafter!r} is not 'package.module:Class'")
        for hook in ("from_dict", "to_dict", "from_hf", "to_hf", "for_target", "fixed_depth"):
            if not hasattr(self.config, hook):
                problems.append(f"config {self.config.__name__} has no {hook}")
        if problems:
            raise HeadKindError(f"head kind {self.name!r}: " + "; ".join(problems))
        return self
