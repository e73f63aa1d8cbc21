"""The head kinds specheads ships, one entry each; `specheads.heads.registry` registers them."""

from __future__ import annotations

from specheads.heads import eagle, eagle3, medusa, mtp
from specheads.heads.kind import HeadKind
from specheads.training.ttt import ttt_loss, ttt_unroll

EAGLE3 = HeadKind(
    name="eagle3",
    title="EAGLE-3",
    config=eagle3.Eagle3Config,
    module=eagle3.Eagle3Head,
    unroll=ttt_unroll,
    loss=ttt_loss,
    weights=eagle3.weight_shapes,
    mismatches=eagle3.head_mismatches,
    exporters={"sglang": eagle3.sglang_config, "vllm": eagle3.vllm_config, "speculators": eagle3.speculators_config},
    hub_architectures={"sglang": (eagle3.ARCHITECTURE,), "vllm": (eagle3.ARCHITECTURE,),
                       "speculators": (eagle3.SPECULATORS_ARCHITECTURE,)},
    tensor_exporters={"speculators": eagle3.speculators_tensors},
    launch={**eagle3.LAUNCH, "speculators": eagle3.LAUNCH["vllm"]},
    card_head=eagle3.card_head,
    drafter="specheads.drafters.eagle:Eagle3Drafter",
    # the head's tree, or prompt lookup's chain where the text repeats: on the evaluation suite's test split
    # (SmolLM2-135M-Instruct, one H200, 2026-12-02) 2.92x our ar on chat against the tree's 2.35x, 3.09x on
    # coding against 2.64x (docs/benchmarks.md, "The n-gram assist")
    ngram_assist=True,
)

MTP = HeadKind(
    name="mtp",
    title=mtp.TITLE,
    config=mtp.MTPConfig,
    module=mtp.MTPHead,
    unroll=mtp.mtp_unroll,
    loss=ttt_loss,
    weights=mtp.weight_shapes,
    mismatches=mtp.head_mismatches,
    # no engine runs MTP layers for a target that did not ship them: specheads' own folder; speculators'
    # `mtp` layout for a one-module, full-vocabulary head of a Qwen3-family target (its training library
    # stitches it into the verifier's checkpoint; vLLM 0.33.0 loads no speculators mtp folder)
    exporters={"speculators": mtp.speculators_config},
    hub_architectures={"speculators": (mtp.SPECULATORS_ARCHITECTURE,)},
    tensor_exporters={"speculators": mtp.speculators_tensors},
    own_architectures=(mtp.ARCHITECTURE,),
    export_checks={"speculators": mtp.speculators_check},
    card_head=mtp.card_head,
    drafter="specheads.drafters.mtp:MTPDrafter",
)

MEDUSA = HeadKind(
    name="medusa",
    title=medusa.TITLE,
    config=medusa.MedusaConfig,
    module=medusa.MedusaHead,
    unroll=medusa.medusa_unroll,
    loss=ttt_loss,
    weights=medusa.weight_shapes,
    mismatches=medusa.head_mismatches,
    exporters={"vllm": medusa.vllm_config},
    tensor_exporters={"vllm": medusa.vllm_tensors},
    hub_architectures={"vllm": (medusa.ARCHITECTURE,)},
    launch=medusa.LAUNCH,
    card_head=medusa.card_head,
    drafter="specheads.drafters.medusa:MedusaDrafter",
    # two heads deep, eight wide: the best of twelve trees on the validation split's chat prompts at batch 1
    # (1.42x our ar; 2,4,6 1.37x, 2,10,15 1.39x, 1,8,8 1.38x, 2,12,18 1.27x: 19 verified rows cross the
    # projections' 16-row block), one H200, 2026-12-02 (docs/results/head-kinds-medusa-wide-h200/). Medusa's
    # later heads see no draft token and are right less often, so width pays where depth does not
    default_tree=(2, 8, 12),
    # with prompt lookup's chain where the text repeats: on the evaluation suite's test split (SmolLM2-135M-
    # Instruct, one H200, 2026-12-03) 2.46x our ar on chat at batch 1 against the tree's 1.46x, 1.67x against
    # 1.01x at batch 8, coding 2.71x and 1.70x against 1.61x and 1.03x (docs/results/medusa-assist-h200/)
    ngram_assist=True,
)

EAGLE = HeadKind(
    name="eagle",
    title=eagle.TITLE,
    config=eagle.EagleConfig,
    module=eagle.EagleHead,
    unroll=eagle.eagle_unroll,
    loss=eagle.eagle_loss,
    weights=eagle.weight_shapes,
    mismatches=eagle.head_mismatches,
    exporters={"sglang": eagle.sglang_config, "vllm": eagle.vllm_config, "speculators": eagle.speculators_config},
    hub_architectures={"sglang": (eagle.SGLANG_ARCHITECTURE,), "vllm": (eagle.VLLM_ARCHITECTURE,),
                       "speculators": eagle.SPECULATORS_ARCHITECTURES},
    # SGLang's fc has a bias (zeros: the head trains without one); vLLM's folder is the head's own;
    # speculators names fc fusion_fc and the layer transformer (and such a folder loads back)
    tensor_exporters={"sglang": eagle.sglang_tensors, "speculators": eagle.speculators_tensors},
    tensor_importer=eagle.import_tensors,
    # no speculators launch: no engine at specheads' pins serves that type (vLLM 0.33.0 refuses it)
    launch=eagle.LAUNCH,
    card_head=eagle.card_head,
    drafter="specheads.drafters.eagle1:Eagle1Drafter",
)

BUILTIN_KINDS = (EAGLE3, MTP, MEDUSA, EAGLE)
# the kind of a run config that names none, and of head folders whose specheads.json names none
DEFAULT_KIND = EAGLE3.name
