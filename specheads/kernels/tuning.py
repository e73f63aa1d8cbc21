"""Kernel tuning: one typed object that the kernels read, instead of settings read at import.

    from specheads.kernels import tuning

    t = tuning.KernelTuning.for_device(device)        # the card's defaults
    t = t.replace(attention_chunk=64, draft_warps=4)   # any field, by name
    t = tuning.KernelTuning.from_dict(json.load(f), base=t)
    tuning.use(t)                                      # process-wide, until the next use()
    with tuning.using(t): ...                          # for a block, then the previous one again

Two groups of fields:

  Speed     launch settings that change how fast a kernel runs, never a bit of what the target
            computes (logits, KV cache): the projection's column blocks, pipeline stages and
            row blocks, the L2 prefetch, the fused norm's loads, which kernels take
            programmatic dependent launch. (draft_warps may round the drafter's own sums
            differently: that changes what is drafted at most, never a token of the output.)
  Numerics  what orders a reduction, picks the kernel that serves an op, or was measured to
            change bf16 bits: the projection's K step and warps per weight shape, which weight
            shapes our projection kernel takes, the attention's keys per chunk. Fixed per
            weight shape and shared by every call (decode, tree verify, prefill, any number of
            rows), so a token's logits do not depend on how many tokens or rows were computed
            with it.

Which group a field is in was checked on an H200 (gpu_runs/tuning_check.py, results in
docs/results/tuning-check-h200: random SmolLM2-135M- and Llama-3.1-8B-shaped targets, a 1-, 8-
and 41-token forward compared bit for bit): every Speed field kept every bit; 8 warps instead of
4 over the narrow projections of a 41-row tree, and 64- or 128-row attention blocks over a
41-token tree, changed bits, so warps and the attention row block are Numerics.

Who sets it: whoever builds the engine calls `use(tuning)` with the object it was given
(default: `KernelTuning.for_device(device)`) before the models are fused and the CUDA graphs
captured; `specheads generate` and `serve` take one as --kernel-tuning (JSON over the card's
defaults). The kernel wrappers read `active()` on every call, eager or during a graph capture;
a captured graph replays the launches it recorded, so a later `use()` only reaches graphs
captured after it. One tuning serves the whole process: engines in one process share it.

Settings that change drafts only, never the output (the draft head's int8 lm_head), are not
kernel tuning: they are options of the engine and of `Eagle3Head.fuse_for_inference`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping

Shape = tuple[int, int]  # a weight's [N, K]: N outputs (rows) over K inputs (columns)


class TuningError(ValueError):
    """A kernel tuning field out of range, or an unknown field: names the field and what is allowed."""


# the kernels that can take programmatic dependent launch (the names kernels pass to fused.pdl_options)
PDL_KERNEL_NAMES = frozenset({"linear", "attention", "rope_cache", "rmsnorm", "silu_mul", "embedding", "head_input",
                              "topk_expand", "feed_inputs", "select_tree", "tree_mask", "accept", "kv_commit"})
# the target / head forward's kernels. The drafting and verification kernels, which sit between
# torch ops, launch as usual: with PDL the batch-8 tree ran ~6% slower on the H200
PDL_DEFAULT = frozenset({"linear", "attention", "rope_cache", "rmsnorm", "silu_mul", "embedding"})
WARPS = (1, 2, 4, 8, 16, 32)  # the num_warps a Triton launch accepts

# Wide weights (K > linear_max_k) that our projection kernel serves at decode, with the tile
# measured on an H200 against cuBLAS with its separate norm / silu / residual kernels, each
# weight streamed from HBM (gpu_runs/wide_gemm.py; docs/results/runtime-h200-2026-11-27c/wide_gemm.json).
# The Llama-3-8B / Mistral-7B shapes (hidden 4096, 8 KV heads, MLP 14336):
#   shape: (BLOCK_N, BLOCK_K, num_warps, num_stages)   ours vs cuBLAS + its extra kernel
WIDE_TILES: dict[Shape, tuple[int, int, int, int]] = {
    (6144, 4096): (64, 256, 4, 4),  # qkv with its norm: 17.6 vs 18.8 us
    (4096, 4096): (32, 512, 4, 4),  # o_proj onto the residual: 11.3 vs 14.7 us
    (28672, 4096): (64, 128, 8, 3),  # gate_up with norm and silu: 60.2 vs 66.3 us
    (4096, 14336): (32, 512, 4, 4),  # down onto the residual: 30.4 vs 33.6 us
    (128256, 4096): (64, 256, 4, 3),  # lm_head: 238.0 us (4.4 TB/s) vs 249.3 us
}


# SmolLM2-135M's narrow weights over many rows (a batch of trees): (above_rows, BLOCK_M, BLOCK_N)
MANY_ROW_TILES: dict[Shape, tuple[tuple[int, int, int], ...]] = {
    (960, 576): ((64, 16, 64), (128, 32, 64), (256, 32, 128), (1024, 64, 64)),  # qkv with its norm
    (576, 576): ((64, 64, 32), (128, 64, 32), (256, 64, 64), (1024, 64, 64)),  # o_proj onto the residual
    (3072, 576): ((64, 32, 64), (128, 32, 128), (256, 64, 128), (1024, 64, 64)),  # gate_up with norm and silu
    (576, 1536): ((64, 64, 32), (128, 64, 32), (256, 64, 64), (1024, 64, 64)),  # down onto the residual
}  # (above 1024 rows, prefills: the many-row tile of the rule, unswept)


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _int(group: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TuningError(f"{group}.{name} = {value!r}: expected an integer")
    return value


def _check(group: str, name: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise TuningError(f"{group}.{name} = {value!r}: expected {allowed}")


def _shape(group: str, name: str, key: Any) -> Shape:
    """(N, K) from a tuple or from the JSON form "NxK"."""
    try:
        n, k = (int(v) for v in key.split("x")) if isinstance(key, str) else (int(v) for v in key)
    except (ValueError, TypeError, AttributeError):
        raise TuningError(f"{group}.{name}: weight shape {key!r} is not of the form \"NxK\" (rows x columns, "
                          f"e.g. \"6144x4096\")") from None
    if n <= 0 or k <= 0:
        raise TuningError(f"{group}.{name}: weight shape {key!r} must have positive rows and columns")
    return n, k


def _frozen_map(d: Mapping) -> Mapping:
    return MappingProxyType(dict(d))


@dataclass(frozen=True)
class Speed:
    """Launch settings: any valid value gives the same output bits (see the module docstring)."""

    # projection tiles by weight shape [N, K]: (BLOCK_N, num_stages) instead of the rule in
    # linear._config (the K step and warps are Numerics.linear_shapes)
    linear_tiles: Mapping[Shape, tuple[int, int]] = field(
        default_factory=lambda: {s: (bn, st) for s, (bn, _, _, st) in WIDE_TILES.items()})
    # a call over more than 16 rows of a narrow weight (N < 8192: a tree verify, a prefill) takes
    # linear_row_block rows and linear_tree_n_scale x BLOCK_N columns a program. SmolLM2's graphed 41-token
    # forward, H200, (row block, n scale): (16, 1) 0.830 ms, (16, 2) 0.808, (16, 4) 0.880,
    # (32, 1) 0.960, (64, 1) 0.998
    linear_row_block: int = 16
    linear_tree_n_scale: int = 2
    # calls of more rows than this over a narrow weight (batched tree verifies, prefills) take
    # linear_many_row_block rows, at least linear_many_n columns and K steps of at most
    # linear_many_k a program (a down_proj's 512-key steps leave no room for pipelining there:
    # SmolLM2's 576 x 1536 over 512 rows 11.1 -> 8.4 us at 128, H200, the same bits)
    linear_many_rows: int = 256
    linear_many_row_block: int = 64
    linear_many_n: int = 64
    linear_many_k: int = 128
    # and this many pipeline stages (SmolLM2's fused gate_up over 512 rows 14.1 -> 11.8 us at 3
    # instead of 4, H200)
    linear_many_stages: int = 3
    # tiles by weight shape [N, K] and number of rows for calls over more than 16 rows of a
    # narrow weight: ((above_rows, BLOCK_M, BLOCK_N), ...) ascending, the last entry whose
    # above_rows the call exceeds takes it (with K steps of at most linear_many_k and
    # linear_many_stages stages); below the first, the rules above. By default SmolLM2's
    # shapes, swept on an H200 (gpu_runs/kernel_bench.py --only linear --sweep-rows 128 256
    # 512; docs/results/tree-speed-h200/kernel_bench_linear_tiles.json, whose labels give half
    # the columns: that sweep's tiles took linear_tree_n_scale too; every tile the same
    # bits): a layer's four projections over 128 / 256 / 512 rows (a 16-token tree at batch
    # 8 / 16 / 32) 23.8 / 33.3 / 33.5 -> 19.2 / 24.0 / 29.7 us (kernel_bench_linear.json)
    linear_many_tiles: Mapping[Shape, tuple[tuple[int, int, int], ...]] = field(
        default_factory=lambda: dict(MANY_ROW_TILES))
    # calls of more rows than this over a wide weight (N >= 8192: an lm_head over batched trees)
    # take (rows, columns) tiles of linear_wide_many_tile: SmolLM2's 49152 x 576 over 128 / 512
    # rows 40.0 / 144.8 -> 33.4 / 103.6 us at (128, 256), H200 (gpu_runs/kernel_bench.py)
    linear_wide_many_rows: int = 64
    linear_wide_many_tile: tuple[int, int] = (128, 256)
    # before its PDL wait a projection program asks L2 for the first columns of its weight
    # slice: up to this many bytes of the whole weight (0: none)
    linear_prefetch_bytes: int = 8 * 2**20
    # inputs the fused norm's first pass loads at once (in K steps; the sum keeps its order);
    # 0 or one K step: one at a time
    linear_norm_keys: int = 1024
    # the target's causal attention splits a token's keys over programs, one chunk each (split-K,
    # merged in chunk order), while a call has fewer than this many (row, kv head, token tile)
    # programs; from there each program folds its chunks in turn. The same bits either way.
    # SmolLM2's 16-token tree, H100 (gpu_runs/kernel_bench.py), us a layer split / not: batch 1
    # (48 programs) 6.5 / 10.3; batch 8 (192) 13.7 / 11.8 at 300 keys, 25.0 / 23.9 at 700;
    # batch 32 (384) 30.7 / 29.2 and 62.5 / 57.5
    attention_split_below: int = 128
    # at most this many programs for a split call (0: one program a chunk, however many): past
    # it, each program sums several neighbouring chunks, each chunk's partial still stored and
    # merged in chunk order (the same bits). For calls of more programs than the card has SMs
    attention_split_programs: int = 0
    # tokens of a draft tree a causal-attention program takes (at most what fits its 16 rows)
    # at batches below attention_tree_many_batch, all that fit from there: the blocks that hold
    # tree positions cost one pass per path of the tree among the program's tokens, so fewer
    # tokens a program shorten the step's slowest program; more read the keys below the tree
    # fewer times. SmolLM2's 16-token tree (random parents) over 300 / 700 keys, H200
    # (gpu_runs/kernel_bench.py, the tree plan worked out once), us a layer at 1 / 2 / 3 tokens /
    # all that fit: batch 1 (split) 5.8 / 5.8 / 6.3 / 9.7 and 8.6 / 7.4 / 8.6 / 11.9; batch 8
    # 11.5 / 10.2 / 11.6 / 13.8 and 21.9 / 19.1 / 21.9 / 24.7; batch 32 31.9 / 20.5 / 28.8 / 26.8
    # and 59.1 / 38.4 / 47.1 / 34.5
    attention_tree_tokens: int = 2
    attention_tree_many_batch: int = 64
    # ... but one token a program where the call would otherwise launch at most this many
    # programs (chunks of a split call counted): short contexts at batch 1, where the card is
    # mostly idle and twice the programs finish sooner. SmolLM2's step of the 6,4,15 tree at
    # batch 1, H200 (gpu_runs/bucket_costs.py, random weights), ms at 2 tokens / 1: 64 keys
    # (24 programs) 0.915 / 0.864, 128 (24) 0.956 / 0.904, 256 (48) 0.995 / 0.954; 512 (96)
    # 1.018 / 1.023, 1,024 (192) 1.101 / 1.088; batch 8 at 512 keys 1.547 / 1.553
    attention_tree_one_token_programs: int = 64
    # software-pipeline stages of the causal attention's loop over the blocks below a tree (or
    # a decode's last block) when a program sums all of its chunks (a split-K program, one
    # chunk of two blocks, takes 1): loads of the next blocks run while one is summed. Same
    # shapes, batch 8 / 32 at 700 keys: 1 stage 21.5 / 44.9 us, 3 stages 19.1 / 38.4
    attention_stages: int = 3
    # warps of the one-program-per-row drafting kernels (topk_expand, select_tree). The
    # SmolLM2 head's draft at batch 1 (H200): 1 warp 0.48 ms, 2 0.46, 4 0.379, 8 0.375. The
    # expansion's sums may round differently (2, 16 and 32 warps did against 8 on the H200):
    # drafts may change, the output never
    draft_warps: int = 8
    # vocabulary entries a first-stage program of the top-k expansion reads (0: the kernel's own
    # default, kernels/draft.py BLOCK_V, 2048): fewer entries a program, more programs and more
    # candidates for the row's last program to merge. The lse's sums may round differently: drafts
    # may change, the output never
    draft_block: int = 0
    # kernels launched with programmatic dependent launch on cards that have it (Hopper and
    # later): each waits on the GPU for its predecessor's writes, hiding the launch gap.
    # SmolLM2's 1-token forward 0.87 -> 0.69 ms on an H200 (gpu_runs/pdl_check.py)
    pdl_kernels: frozenset[str] = PDL_DEFAULT
    # a PDL kernel of more programs than this waits without letting the next kernel launch
    # early (kernels/fused.py pdl_options; 0: the card's SM count)
    pdl_early_programs: int = 0

    def __post_init__(self):
        g = "speed"
        tiles = {}
        for key, tile in dict(self.linear_tiles).items():
            shape = _shape(g, "linear_tiles", key)
            try:
                block_n, stages = (int(v) for v in tile)
            except (ValueError, TypeError):
                raise TuningError(f"{g}.linear_tiles[{key!r}] = {tile!r}: expected [BLOCK_N, num_stages]") from None
            _check(g, f"linear_tiles[{key!r}]", tile, _pow2(block_n) and block_n >= 16 and stages >= 1,
                   "[BLOCK_N, num_stages]: BLOCK_N a power of two >= 16, num_stages >= 1")
            tiles[shape] = (block_n, stages)
        object.__setattr__(self, "linear_tiles", _frozen_map(tiles))
        many = {}
        for key, entries in dict(self.linear_many_tiles).items():
            shape = _shape(g, "linear_many_tiles", key)
            try:
                rows = tuple((int(a), int(m), int(n)) for a, m, n in entries)
            except (ValueError, TypeError):
                raise TuningError(f"{g}.linear_many_tiles[{key!r}] = {entries!r}: expected a list of "
                                  "[above_rows, BLOCK_M, BLOCK_N]") from None
            _check(g, f"linear_many_tiles[{key!r}]", entries,
                   len(rows) > 0 and all(a >= 16 and _pow2(m) and 16 <= m <= 128 and _pow2(n) and n >= 16
                                         for a, m, n in rows) and [a for a, _, _ in rows] == sorted({a for a, _, _ in rows}),
                   "[[above_rows, BLOCK_M, BLOCK_N], ...]: above_rows >= 16 ascending, BLOCK_M a power of two "
                   "from 16 to 128, BLOCK_N a power of two >= 16")
            many[shape] = rows
        object.__setattr__(self, "linear_many_tiles", _frozen_map(many))
        v = _int(g, "linear_row_block", self.linear_row_block)
        _check(g, "linear_row_block", v, _pow2(v) and 16 <= v <= 64, "16, 32 or 64")
        v = _int(g, "linear_tree_n_scale", self.linear_tree_n_scale)
        _check(g, "linear_tree_n_scale", v, _pow2(v) and v <= 16, "a power of two from 1 to 16")
        v = _int(g, "linear_many_rows", self.linear_many_rows)
        _check(g, "linear_many_rows", v, v >= 16, "an integer >= 16")
        v = _int(g, "linear_many_row_block", self.linear_many_row_block)
        _check(g, "linear_many_row_block", v, _pow2(v) and 16 <= v <= 128, "16, 32, 64 or 128")
        v = _int(g, "linear_many_n", self.linear_many_n)
        _check(g, "linear_many_n", v, _pow2(v) and 16 <= v <= 256, "a power of two from 16 to 256")
        v = _int(g, "linear_many_k", self.linear_many_k)
        _check(g, "linear_many_k", v, _pow2(v) and v >= 16, "a power of two >= 16")
        v = _int(g, "linear_many_stages", self.linear_many_stages)
        _check(g, "linear_many_stages", v, v >= 1, "an integer >= 1")
        v = _int(g, "linear_wide_many_rows", self.linear_wide_many_rows)
        _check(g, "linear_wide_many_rows", v, v >= 16, "an integer >= 16")
        tile = self.linear_wide_many_tile
        ok = (isinstance(tile, (tuple, list)) and len(tile) == 2 and all(isinstance(x, int) and _pow2(x) for x in tile)
              and 16 <= tile[0] <= 256 and 16 <= tile[1] <= 512)
        _check(g, "linear_wide_many_tile", tile, ok, "[rows, columns]: powers of two, 16..256 rows, 16..512 columns")
        object.__setattr__(self, "linear_wide_many_tile", tuple(tile))
        v = _int(g, "linear_prefetch_bytes", self.linear_prefetch_bytes)
        _check(g, "linear_prefetch_bytes", v, v >= 0, "an integer >= 0 (0: no prefetch)")
        v = _int(g, "linear_norm_keys", self.linear_norm_keys)
        _check(g, "linear_norm_keys", v, v >= 0, "an integer >= 0")
        v = _int(g, "attention_split_below", self.attention_split_below)
        _check(g, "attention_split_below", v, v >= 0, "an integer >= 0 (0: never split)")
        v = _int(g, "attention_split_programs", self.attention_split_programs)
        _check(g, "attention_split_programs", v, v >= 0, "an integer >= 0 (0: a program a chunk)")
        v = _int(g, "attention_tree_tokens", self.attention_tree_tokens)
        _check(g, "attention_tree_tokens", v, v >= 1, "an integer >= 1")
        v = _int(g, "attention_tree_many_batch", self.attention_tree_many_batch)
        _check(g, "attention_tree_many_batch", v, v >= 1, "an integer >= 1")
        v = _int(g, "attention_tree_one_token_programs", self.attention_tree_one_token_programs)
        _check(g, "attention_tree_one_token_programs", v, v >= 0, "an integer >= 0 (0: never)")
        v = _int(g, "attention_stages", self.attention_stages)
        _check(g, "attention_stages", v, 1 <= v <= 6, "an integer from 1 to 6")
        v = _int(g, "pdl_early_programs", self.pdl_early_programs)
        _check(g, "pdl_early_programs", v, v >= 0, "an integer >= 0 (0: the card's SM count)")
        v = _int(g, "draft_warps", self.draft_warps)
        _check(g, "draft_warps", v, v in WARPS, f"one of {WARPS}")
        v = _int(g, "draft_block", self.draft_block)
        _check(g, "draft_block", v, v == 0 or (_pow2(v) and 16 <= v <= 16384),
               "0 (the kernel's default) or a power of two from 16 to 16384")
        names = self.pdl_kernels
        if isinstance(names, str):
            raise TuningError(f"{g}.pdl_kernels = {names!r}: expected a set of kernel names")
        names = frozenset(names)
        unknown = sorted(names - PDL_KERNEL_NAMES)
        if unknown:
            raise TuningError(f"{g}.pdl_kernels: unknown kernel {unknown[0]!r}; expected names from "
                              f"{', '.join(sorted(PDL_KERNEL_NAMES))}")
        object.__setattr__(self, "pdl_kernels", names)


@dataclass(frozen=True)
class Numerics:
    """What decides the output bits (see the module docstring); change it only knowing that
    bf16 outputs then round differently (float32 ones to within float32 rounding)."""

    # widest input K our projection kernel serves by its tile rule; wider weights take cuBLAS
    # (whose bits depend on the number of rows: speculation is then not bit-exact) unless
    # linear_shapes has an entry for their shape. The default serves every width
    linear_max_k: int = 65536
    # our projection by weight shape [N, K]: (BLOCK_K, num_warps), the K step and warps over the
    # rule in linear._config (the rest of the tile is Speed.linear_tiles); None: cuBLAS serves
    # that shape
    linear_shapes: Mapping[Shape, tuple[int, int] | None] = field(
        default_factory=lambda: {s: (bk, w) for s, (_, bk, w, _) in WIDE_TILES.items()})
    # keys per split-K attention program, one size for every call: chunk boundaries then sit at
    # the same keys in a 1-token decode and in a tree, so a token's attention sums in the same
    # order in both (per-shape sizes time up to ~1 us better a call, but cut identical bf16
    # outputs of chain and ngram from 6/6 to 4/6-5/6 on the H100)
    attention_chunk: int = 128
    # stacked query rows a draft head's attention program takes, the same for every call
    attention_row_block: int = 16
    # "triton": our attention kernel where it serves; "sdpa": the torch reference everywhere
    attention: str = "triton"
    # a projection's fused RMSNorm: "prepass" rounds where the eager modules round (a first
    # pass over a row's inputs for its mean square, then bf16(w * bf16(x * rstd)) into the
    # dot); "folded" sums the squares from the dot's own loads and scales the dot's output by
    # rstd (bf16(w * x) into the dot, in NORM_K steps): no first pass, rounding differently.
    # The first pass costs SmolLM2's qkv 3.8 against 2.3 us without a norm at 16 rows, 4.6
    # against 3.4 at 128 (H200). "folded" is tested on CPU, not yet timed or bit-checked on a
    # GPU (gpu_runs/kernel_bench.py --only linear prints it; gpu_runs/bit_check.py --set
    # linear_norm=folded)
    linear_norm: str = "prepass"

    def __post_init__(self):
        g = "numerics"
        _check(g, "linear_norm", self.linear_norm, self.linear_norm in ("prepass", "folded"), "'prepass' or 'folded'")
        v = _int(g, "linear_max_k", self.linear_max_k)
        _check(g, "linear_max_k", v, v >= 0, "an integer >= 0")
        shapes = {}
        allowed = f"[BLOCK_K, num_warps]: BLOCK_K a power of two >= 16, num_warps one of {WARPS}; or null (cuBLAS)"
        for key, entry in dict(self.linear_shapes).items():
            shape = _shape(g, "linear_shapes", key)
            if entry is not None:
                try:
                    block_k, warps = entry
                except (ValueError, TypeError):
                    raise TuningError(f"{g}.linear_shapes[{key!r}] = {entry!r}: expected {allowed}") from None
                _check(g, f"linear_shapes[{key!r}]", entry, all(isinstance(v, int) and not isinstance(v, bool)
                       for v in entry) and _pow2(block_k) and block_k >= 16 and warps in WARPS, allowed)
                entry = (block_k, warps)
            shapes[shape] = entry
        object.__setattr__(self, "linear_shapes", _frozen_map(shapes))
        v = _int(g, "attention_chunk", self.attention_chunk)
        _check(g, "attention_chunk", v, _pow2(v) and v >= 64, "a power of two >= 64")
        v = _int(g, "attention_row_block", self.attention_row_block)
        _check(g, "attention_row_block", v, _pow2(v) and 16 <= v <= 256, "a power of two from 16 to 256")
        _check(g, "attention", self.attention, self.attention in ("triton", "sdpa"), "'triton' or 'sdpa'")


_GROUPS = {"speed": Speed, "numerics": Numerics}


def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@dataclass(frozen=True)
class KernelTuning:
    """Every kernel setting: `speed` (never changes a result bit) and `numerics` (decides them)."""

    speed: Speed = field(default_factory=Speed)
    numerics: Numerics = field(default_factory=Numerics)

    def __post_init__(self):
        if not isinstance(self.speed, Speed) or not isinstance(self.numerics, Numerics):
            raise TuningError("KernelTuning takes a Speed and a Numerics")

    @classmethod
    def for_device(cls, device=None) -> "KernelTuning":
        """The defaults for a device (torch.device or a string such as "cuda:1"; None: the
        current CUDA device if there is one, else CPU): an entry of CARD_DEFAULTS whose name is
        part of the card's name, else the defaults (measured on the H100 and H200)."""
        import torch

        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda" and torch.cuda.is_available():
            name = torch.cuda.get_device_name(device)
            for card, tuning in CARD_DEFAULTS.items():
                if card in name:
                    return tuning
        return cls()

    def replace(self, **fields) -> "KernelTuning":
        """A copy with fields of either group changed by name (each name is in one group),
        e.g. replace(attention_chunk=64, draft_warps=4); validated as a new object is."""
        changes = {name: {} for name in _GROUPS}
        for name, value in fields.items():
            group = next((g for g, cls in _GROUPS.items() if name in _field_names(cls)), None)
            if group is None:
                raise TuningError(f"unknown kernel tuning field {name!r}; expected one of "
                                  f"{', '.join(_field_names(Speed) + _field_names(Numerics))}")
            changes[group][name] = value
        return KernelTuning(dataclasses.replace(self.speed, **changes["speed"]),
                            dataclasses.replace(self.numerics, **changes["numerics"]))

    def to_dict(self) -> dict:
        """The JSON form: {"speed": {...}, "numerics": {...}}; weight shapes as "NxK"."""
        out = {}
        for group in _GROUPS:
            obj = getattr(self, group)
            d = {}
            for name in _field_names(type(obj)):
                value = getattr(obj, name)
                if isinstance(value, Mapping):
                    value = {f"{n}x{k}": list(v) if isinstance(v, tuple) else v for (n, k), v in sorted(value.items())}
                elif isinstance(value, frozenset):
                    value = sorted(value)
                d[name] = value
            out[group] = d
        return out

    @classmethod
    def from_dict(cls, data: Mapping, base: "KernelTuning | None" = None) -> "KernelTuning":
        """From the JSON form (to_dict's): fields given replace the base's (default: the
        defaults) whole, tables included (a table lists every shape it sets); pdl_kernels also
        takes "all" or "none". Unknown groups or fields are errors that name them."""
        if not isinstance(data, Mapping):
            raise TuningError(f"kernel tuning must be an object {{\"speed\": {{...}}, \"numerics\": {{...}}}}, "
                              f"got {type(data).__name__}")
        base = base or cls()
        groups = {}
        for group, values in data.items():
            if group not in _GROUPS:
                raise TuningError(f"unknown kernel tuning group {group!r}; expected 'speed' or 'numerics'")
            if not isinstance(values, Mapping):
                raise TuningError(f"kernel tuning {group!r} must be an object of fields")
            names = _field_names(_GROUPS[group])
            for name in values:
                if name not in names:
                    raise TuningError(f"unknown kernel tuning field {group}.{name}; expected one of {', '.join(names)}")
            values = dict(values)
            if isinstance(values.get("pdl_kernels"), str):
                word = values["pdl_kernels"]
                if word not in ("all", "none"):
                    raise TuningError(f"speed.pdl_kernels = {word!r}: expected a list of kernel names, 'all' or 'none'")
                values["pdl_kernels"] = PDL_KERNEL_NAMES if word == "all" else frozenset()
            for table in ("linear_tiles", "linear_shapes", "linear_many_tiles"):
                if isinstance(values.get(table), Mapping):
                    values[table] = {_shape(group, table, k): tuple(v) if isinstance(v, list) else v
                                     for k, v in values[table].items()}
            groups[group] = dataclasses.replace(getattr(base, group), **values)
        return cls(groups.get("speed", base.speed), groups.get("numerics", base.numerics))

    @classmethod
    def parse(cls, text: str, base: "KernelTuning | None" = None) -> "KernelTuning":
        """from_dict of JSON text, or of the JSON file at that path (a command line's
        --kernel-tuning)."""
        from pathlib import Path

        source = text
        if not text.lstrip().startswith("{"):
            path = Path(text)
            if not path.is_file():
                raise TuningError(f"kernel tuning {text!r} is neither a JSON object nor a JSON file")
            source = path.read_text()
        try:
            data = json.loads(source)
        except json.JSONDecodeError as e:
            raise TuningError(f"kernel tuning {text!r} is not valid JSON: {e}") from None
        return cls.from_dict(data, base)


# Per-card defaults by a part of torch.cuda.get_device_name(), where a card's measured settings
# differ from the defaults above; the H100 and H200 take the defaults, and so does any card
# not listed until it is measured (gpu_runs/wide_gemm.py and verify_kernels.py sweep them).
CARD_DEFAULTS: dict[str, KernelTuning] = {}

_active = KernelTuning()


def active() -> KernelTuning:
    """The tuning the kernels use now (the defaults until `use` is called)."""
    return _active


def use(tuning: KernelTuning) -> KernelTuning:
    """Make `tuning` the one the kernels read, process-wide; returns the previous one."""
    global _active
    if not isinstance(tuning, KernelTuning):
        raise TuningError(f"use() takes a KernelTuning, got {type(tuning).__name__}")
    previous, _active = _active, tuning
    return previous


def use_given(text: str | None) -> KernelTuning:
    """A command line's --kernel-tuning (JSON or a JSON file; None: nothing) over the card's
    defaults, made the one the kernels read (before an engine fuses its models and captures its
    graphs); returns the tuning now in use."""
    if text:
        use(KernelTuning.parse(text, base=KernelTuning.for_device()))
    return active()


@contextlib.contextmanager
def using(tuning: KernelTuning) -> Iterator[KernelTuning]:
    """`use(tuning)` for the block, then the previous tuning again."""
    previous = use(tuning)
    try:
        yield tuning
    finally:
        use(previous)
