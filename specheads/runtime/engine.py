"""The speculative engine: draft a tree, verify it in one target forward, accept, commit.

Requests occupy rows of a preallocated KV cache (`max_batch` rows of `max_len` tokens plus
room for one tree). Active rows are packed at the front; a request joins with a prefill
into the next free row and leaves by moving the last row into its place, so requests join
and leave between steps (continuous batching) and the step itself always sees rows [:b].

One step for rows [:b] (row r has L_r committed tokens in the target cache and a root
token, the last emitted one, not yet in it):
  draft   the drafter proposes a tree of N nodes under each root (a device drafter inside
          the step; a host drafter before it, its tree copied in: specheads.drafters);
  verify  one target forward over [root + N nodes] at positions L_r + depth, written to
          cache slots L_r + node index, under the tree mask on top of the prefix;
  accept  at every node the target picks its token y (argmax, or a sample of its own
          warped distribution); from the root, follow the child whose token is y while one
          exists. The last node's y is the bonus token. Every emitted token is the
          target's own choice, so greedy output equals plain decoding and sampled output
          follows the target's distribution (lossless). With top-k drafts (distinct
          siblings, chosen without sampling) this is exactly recursive rejection sampling
          over the siblings: a sibling is accepted with the target's probability of it;
  commit  the accepted path's KV entries move to slots L_r.. (Triton); the drafter commits
          the path with the target's outputs there (its `commit`).
On CUDA the whole step (draft, verify, accept, commit) replays as one CUDA graph per
(batch bucket, context bucket, greedy/sampled, tier); one host sync per step reads the result.

Tiers: a speculation policy (runtime.policy) picks the tree each step verifies: the engine's
own (fixed), or with the adaptive policy one of several smaller trees (each tier a drafter
sharing the full one's weights and row state, `Drafter.tier`) or none (tier 0: every row
verifies its next token alone), by the rows' recent acceptance and each tier's measured cost.
A tier never changes an output: the accept walk follows the target's own tokens.
A request that joins alone prefills through a captured graph too (one per prompt-width
bucket: it runs in a staging row, then moves to the request's row): eager, the launches of a
30-layer prompt forward cost ~12 ms of host time. `capture_common` captures the graphs of
given batch sizes at once (a server does at start), so no request waits for a capture.

Overlap: every input of a step (roots, committed lengths, the drafter's state) lives on
the device, so with a device drafter (or none) the next step is launched before
the host reads the current one's result: the GPU never waits for the host's bookkeeping.
A host drafter's steps wait for the tokens before them, except plain decode steps (tier 0),
which run ahead too. Under the adaptive policy a host drafter of chains proposes before the
policy chooses, where the tokens are known: rows it has nothing for do not draft, and a step
where no row has anything decodes plainly (the proposal serves the step it plans).
A row that finished in the step being read (a stop, or its token budget) has run one step
too many; that step's output is dropped, and the row's cleanup is queued behind it (as stream
work: a row's tensors are written with `fill_`, never `t[row] = number`, which on CUDA is a
blocking copy of a host scalar and so a wait for the step in flight). No step
runs behind one that ends every row where the host knows it first: every row's last token
of budget is in flight, or the assist's gate has read the step (`_gate`). A step is not run
ahead where a row's cache could not hold it after the step in flight. Requests
that join while a step is in flight are prefilled behind it, and the next step, their rows
included, is launched behind the prefill before the host reads either (a request that ends
at its first token has run one step too many, as above); on an idle engine the first step
goes behind the prefill the same way.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from specheads.drafters import PLAIN, DraftContext, Drafter, DrafterError, DraftSetup, PrefillBatch, StepResult, \
    build_drafter, default_method
from specheads.drafters.assist import default_gate, gate_off
from specheads.kernels import ahead
from specheads.kernels.kv_commit import commit_kv
from specheads.kernels.tuning import active as active_tuning
from specheads.kernels.tuning import use as use_tuning
from specheads.kernels.verify import accept, finish_step, step_inputs
from specheads.runtime.defaults import DEFAULT_TREE, MAX_TOP_LOGPROBS
from specheads.runtime.graphs import capture_graph, next_pow2
from specheads.runtime.policy import FIRST_DRAFT_ROWS, POLICIES, PolicyError, SpeculationProfile, StaticCost, TreeShape, \
    build_policy, context_hint
from specheads.runtime.sampling import InvalidRequest, RowParams, SamplingParams, sample_rows
from specheads.runtime.tree import Tree
from specheads.target.model import KVCache


class EngineError(ValueError):
    pass


@dataclass
class SpecControl:
    """Per-request speculation: off, or a shallower / smaller tree than the engine's.

    enabled "auto": the request drafts while its acceptance (accepted / drafted tokens, an
    exponential average over `window` drafting steps) stays at or above `min_acceptance`;
    below it, its row verifies only its next token (in the same step as the others) and
    drafts again for a probe after `probe_every` such steps."""

    enabled: bool | str = True
    num_steps: int | None = None
    num_draft_tokens: int | None = None
    min_acceptance: float = 0.3
    window: int = 8
    probe_every: int = 32

    def validate(self) -> "SpecControl":
        if self.enabled not in (True, False, "auto"):
            raise InvalidRequest(f"speculation.enabled must be true, false or \"auto\", got {self.enabled!r}")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise InvalidRequest(f"speculation.min_acceptance must be in [0, 1], got {self.min_acceptance}")
        for name in ("window", "probe_every"):
            if not 1 <= getattr(self, name) <= 100_000:
                raise InvalidRequest(f"speculation.{name} must be in 1..100000, got {getattr(self, name)}")
        return self


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    stop_ids: frozenset = frozenset()
    spec: SpecControl = field(default_factory=SpecControl)
    # None: no log-probabilities; k: each emitted token's and the k most likely at its position
    top_logprobs: int | None = None


@dataclass(slots=True)  # (made per request and step: slots make it cheaper)
class StepOutput:
    handle: int
    new_tokens: list[int]
    finish_reason: str | None  # None while running; "stop" | "length"
    drafted: int = 0  # draft tokens verified this step
    accepted: int = 0  # draft tokens the verify accepted this step (the last step's may run past a stop or the budget)
    accept_length: int = 0  # tokens this step produced (accepted drafts + the bonus); 1 for the prefill
    draft_depth: int = 0  # tree depth offered this step (0: no drafts)
    prefill: bool = False  # the first token, from the prompt's forward
    draft_tree: TreeShape | None = None  # the tier the step verified for its rows (None: no drafts)
    # why the step verified no drafts for this request: "request" (speculation off), "auto"
    # (its acceptance fell below min_acceptance); None while it drafts
    no_draft_reason: str | None = None
    # per new token (requests that asked): (its log-probability, [(token, log-probability)] of the
    # top_logprobs most likely), from the target's raw distribution (before temperature / top-p)
    logprobs: list | None = None


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    steps: int = 0  # verify steps (the prefill not counted)
    # draft tokens accepted and produced: a last step's drafts past the token budget or a stop
    # token are not counted (StepOutput.accepted counts what the verify accepted)
    accepted_tokens: int = 0
    accept_per_position: list = field(default_factory=list)  # [k]: steps that produced >= k accepted drafts
    steps_by_tree: dict = field(default_factory=dict)  # verify steps by the tree verified ("S,K,N"; "none")
    seconds: float = 0.0  # from the request's admission to its last token read (generate)

    @property
    def mean_accept_length(self) -> float:
        """Tokens per verify step: accepted drafts + the bonus token, as produced (a stop token
        counts; what a last step accepted past the token budget does not)."""
        return 1.0 + self.accepted_tokens / self.steps if self.steps else 0.0


@dataclass(eq=False, slots=True)  # a row is itself (rows.index, `in`), never equal to another by its fields
class _Row:
    handle: int
    request: Request
    history: list[int]  # prompt + emitted tokens (host drafters read it)
    budget: int
    committed: int  # tokens in the target cache
    speculate: bool = False  # the row drafts (the request wants drafts, the engine has a drafter, auto-off is not on)
    emitted: int = 0
    accept_ema: float | None = None  # enabled "auto": acceptance averaged over drafting steps
    drafting_steps: int = 0  # steps that drafted since the last switch on
    plain_steps: int = 0  # steps decoded without drafts since auto-off switched drafts off
    finished: bool = False  # left the engine (steps launched before that are dropped)
    depth_cap: int = 0  # the deepest draft the row may verify (its request's num_steps, the engine's depth)
    acceptance: object = None  # the speculation policy's record of the row (runtime.policy)
    match_rate: float = 1.0  # a host drafter's chance to propose something for the row (averaged)


@dataclass
class _Launch:
    """A step on its way: the rows it ran for, in row order, and where its result lands."""

    rows: list[_Row]
    host: torch.Tensor
    event: object = None  # torch.cuda.Event on CUDA
    host_logprobs: tuple | None = None  # (chosen [n, D+1], top values [n, D+1, K], top ids) when asked
    tier: int = 0  # the tree verified (0: none; i: the policy's tiers[i - 1])
    drafting: list = field(default_factory=list)  # per row: it drafted (limits at launch)
    batch: int = 0  # the batch bucket
    host_s: float = 0.0  # host time of the launch (a host drafter's proposal included)
    offered: list | None = None  # per row: the draft tokens a host drafter proposed (None: not known)
    ahead: bool = False  # launched while the step before it was in flight
    gated: int = 0  # a drafting step run without the head's tree (SpecEngine._gate): its chain's drafts
    unpaced: bool = False  # its read is no step's pace: a prefill's work (host or card) came between (step)
    read: list | None = None  # its result rows as Python ints, once read (`SpecEngine._read_now`)


@dataclass
class _Joined:
    """Prompts whose prefills are queued (SpecEngine._queue_joins): their rows, their first tokens'
    host copy (ready once `event` is), and per prompt its first token's logprobs or None."""

    rows: list[_Row]
    host: torch.Tensor
    event: object = None
    lps: list = field(default_factory=list)


# Up to this many prompts joining at one step are prefilled one at a time, each replaying the
# captured prefill graph of its width, rather than in one eager forward, whose kernel launches alone
# cost the host about 12 ms for SmolLM2's 30 layers (`_queue_joins`). On an H200 at chat batch
# 64 fed 256 prompts, drafting engines (whose requests end at scattered steps, so two or three join
# at once) spent 6-9 ms a prefill call against `ar`'s 4.2, up to half of their run; with this, 3.3-3.7
# ms for every method (docs/benchmarks.md, "Speculation policy").
STAGED_PREFILL_PROMPTS = 8
# from this batch bucket on, a smaller tier's step behind a plain step or a smaller tier's feeds the head
# the smaller tiers' path width, not the full tree's (`_narrow_feed`): the head's feed is b x width entries
NARROW_FEED_ROWS = 32
MIN_CONTEXT_BUCKET = 128  # the smallest context bucket a step's graph is captured for


def prefill_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive runs of prompt indices whose padded size (count x longest) stays within
    budget; a prompt longer than the budget goes alone."""
    groups, cur, width = [], [], 0
    for i, n in enumerate(lengths):
        if cur and (len(cur) + 1) * max(width, n) > budget:
            groups.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        groups.append(cur)
    return groups


class SpecEngine:
    """method: a name from `specheads.drafters.method_names()` ("ar": no drafter; default: the
    head's kind's default method when a head is given (`KIND+ngram` for the kinds that draft with the
    n-gram assist: drafters/assist.py), else "ar"); or pass a built `drafter`. The tree options
    and `drafter_options` go to the method's builder; the tree they give is the largest a step
    verifies. kernel_tuning: a `specheads.kernels.tuning.KernelTuning` the kernels use from here
    on (None: the active one, by default the card's).

    speculation_policy: "fixed" (that tree at every drafting step) or "adaptive" (per step, one of
    `speculation_tiers` (S,K,N shapes as "S,K,N;..." or a list; default: chains 1, 2 and 4 deep
    and the full tree) or none, by acceptance and cost: runtime.policy), or a policy object.
    speculation_profile: a JSON file of measured step costs, loaded where it exists; with CUDA
    graphs the buckets it lacks are timed on this card (when the engine is idle) and it is saved
    back there. Without graphs
    and without a profile, the adaptive policy uses the static cost model. speculation_settings:
    the adaptive policy's settings ("switch_margin=0.08,window=16" or a dict; runtime.policy
    POLICY_SETTINGS)."""

    def __init__(self, target, head=None, method: str | None = None, num_steps: int = DEFAULT_TREE[0],
                 topk: int = DEFAULT_TREE[1], num_draft_tokens: int = DEFAULT_TREE[2], static_tree=None,
                 max_len: int | None = None, max_batch: int = 8, use_graphs: bool | None = None,
                 overlap: bool = True, prefill_tokens: int = 16384, drafter: Drafter | None = None,
                 drafter_options: dict | None = None, kernel_tuning=None, speculation_policy="fixed",
                 speculation_tiers=None, speculation_profile=None, speculation_settings=None):
        if max_batch < 1:
            raise EngineError(f"max_batch must be >= 1, got {max_batch}")
        self.target = target
        if kernel_tuning is not None:  # before anything is fused or captured
            use_tuning(kernel_tuning)
        self.kernel_tuning = active_tuning()
        if drafter is None:
            method = method or default_method(head)
            try:
                policy = speculation_policy if isinstance(speculation_policy, str) else getattr(
                    speculation_policy, "name", None)
                room = None if max_len is None else target.rotary.max_positions - max_len
                drafter = build_drafter(method, DraftSetup(target, head, num_steps, topk, num_draft_tokens, static_tree,
                                                           dict(drafter_options or {}), policy, room))
            except DrafterError as e:
                raise EngineError(str(e)) from None
        self.method = method or "custom"
        self.drafter = drafter
        # a tree verified at the cache's end reaches `depth` positions past it
        depth = self.drafter.depth if self.drafter is not None else 0
        limit = target.rotary.max_positions - (depth + 1 if self.drafter is not None else 0)
        if max_len is not None and max_len > limit:
            raise EngineError(
                f"max_len {max_len} is too long: the target has {target.rotary.max_positions} positions and a draft "
                f"tree reaches {depth + 1} past the last token, so at most {limit}"
            )
        # default: the target's context, capped so that the cache stays modest
        self.max_len = max_len or min(limit, 4096)
        self.max_batch = max_batch
        if prefill_tokens < 1:
            raise EngineError(f"prefill_tokens must be >= 1, got {prefill_tokens}")
        self.prefill_tokens = prefill_tokens
        self.device = target.model.embed_tokens.weight.device
        self.dtype = target.model.embed_tokens.weight.dtype
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        # capture_common compiles its kernels ahead, in parallel (kernels/ahead.py)
        self.compile_ahead = ahead.enabled()
        # runs of each graph's work before its capture (runtime/graphs.py capture_graph); a start-up's
        # capture runs each graph this many times plus one. One is enough: the kernels are compiled
        # ahead and the first run initialises the libraries; on an H100 at max batch 64 a restart's
        # capture took 18 s with one against 39 s with two (docs/benchmarks.md, start-up;
        # gpu_runs/startup_time.py --capture-warmups)
        self.capture_warmups = 1
        self.buckets = self.use_graphs  # tests set it to run the graphs' shapes eagerly
        # launch step t+1 before reading step t (device drafters only: a host drafter needs t's tokens)
        self.overlap = overlap
        self._inflight: _Launch | None = None
        self._read_at, self._read_key = 0.0, None  # when the last step was read, its (tier, bucket) if run ahead
        if self.device.type == "cuda":
            target.fuse_for_inference()
            if self.drafter is not None:
                self.drafter.prepare(self.device)
        self.rows: list[_Row] = []  # active, in cache-row order
        self.waiting: list[_Row] = []  # added, prefilled at the next step
        self._next_handle = 0
        self._allocated = False
        self._profile_path = Path(speculation_profile) if speculation_profile else None
        self._measuring = False  # the policy's costs are timed here, as buckets are captured
        self._untimed: set[tuple[int, int]] = set()  # buckets met without times: timed once the engine is idle
        self._host_ms: dict[int, float] = {}  # per batch bucket: host time of a host drafter's step
        self._proposal = None  # (tree, seconds): a host drafter's proposal made with the step's plan
        # the last step launched drafted: a plain step after it keeps up with that step's whole path
        # (a plain step after a plain one or a prefill, with the one entry each row has pending)
        self._drafted = False
        # the last step launched was the gate's (`_gate`): its rows may hold the gated chain's whole path
        # pending, which the next step feeds at the long width (`_fed`, `_run`): 0 no, 2 the gated
        # chain's, 3 the ladder's
        self._gated_last = 0
        # the full tree's tier index; the gate's graph index and the ladder's (`_allocate`)
        self._full, self._gated, self._gated_long = 0, None, None
        # the last step launched was plain or a tier smaller than the full tree (not gated): each row
        # holds at most the smaller tiers' path pending, which a wide batch's next smaller-tier step
        # feeds at that width (`_narrow_feed`, graph variant 4: `_run`)
        self._narrow_last = False
        self._narrow_width = None
        # generate() has admitted its last prompt: no request waits for a row (the policy's `drain`
        # setting ranks tiers for the batch's slow end then; runtime/policy.py); a server's engine
        # never drains
        self.draining = False
        self.graph_report: dict = {}
        try:
            self.policy = self._build_policy(speculation_policy, speculation_tiers, speculation_settings)
        except PolicyError as e:
            raise EngineError(str(e)) from None
        chain, long = getattr(self.drafter, "gate_chain", 0), getattr(self.drafter, "gate_long", 0)
        if max(chain, long) > self.num_draft_tokens and not self.gate_rows:
            # (a drafter built outside the engine: as deep as the long chain, which only a gated step drafts)
            raise EngineError(gate_off(max(chain, long), getattr(self.policy, "name", None),
                                       "ngram_gate_long" if long > chain else "ngram_gate_chain"))

    # ------------------------------------------------------------------ policy
    @property
    def full_tree(self) -> TreeShape | None:
        """The largest tree a step verifies (the drafter's), None without a drafter."""
        d = self.drafter
        return TreeShape(d.depth, d.topk, d.num_draft) if d is not None else None

    def _fingerprint(self) -> dict:
        """What a speculation profile's costs belong to, besides the card."""
        s = self.target.spec
        return {"target": f"{s.model_type}: {s.num_hidden_layers} layers, hidden {s.hidden_size}, "
                          f"intermediate {s.intermediate_size}, vocab {s.vocab_size}",
                "method": self.method, "max_tree": str(self.full_tree), "dtype": str(self.dtype)}

    def _device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else self.device.type

    def _build_policy(self, policy, tiers, settings=None):
        if self.drafter is None:  # nothing to choose: every step is a plain decode
            if tiers is not None or self._profile_path is not None or settings:
                raise PolicyError(f"--speculation-tiers, --speculation-settings and --speculation-profile apply to a "
                                  f"method that drafts; method {self.method} drafts nothing")
            return None
        if not isinstance(policy, str):
            if settings:
                raise PolicyError("speculation_settings apply to the named policies; a policy object brings its own")
            return policy  # a policy object (tests, custom policies)
        if policy not in POLICIES:
            raise PolicyError(f"speculation policy {policy!r} is not one of {', '.join(POLICIES)}")
        d = self.drafter
        if policy == "fixed":
            if self._profile_path is not None:
                raise PolicyError("--speculation-profile applies to --speculation-policy adaptive")
            return build_policy("fixed", self.full_tree, tiers, settings=settings)
        built = build_policy("adaptive", self.full_tree, tiers, trees=d.abilities.trees, can_tier=d.abilities.tiers,
                             settings=settings)
        path = self._profile_path
        if path is not None and path.exists():
            # (tiers the profile lacks are timed as its buckets are planned, where graphs are captured)
            built.cost = SpeculationProfile.load(path).check(path, self._device_name(), self._fingerprint(),
                                                              built.tiers, can_time=self.use_graphs)
        elif self.use_graphs:
            built.cost = SpeculationProfile(self._device_name(), self._fingerprint())
        else:
            built.cost = StaticCost()
        self._measuring = self.use_graphs and built.cost.measured  # buckets without times: timed as captured
        return built

    # ------------------------------------------------------------------ limits
    @property
    def num_steps(self) -> int:
        return self.drafter.depth if self.drafter is not None else 0

    @property
    def num_draft_tokens(self) -> int:
        return self.drafter.num_draft if self.drafter is not None else 0

    @property
    def max_drafts(self) -> int:
        """The most drafts a step verifies on a row: the tree's, or the n-gram assist's gated chain
        where ngram_gate_chain or its ladder (ngram_gate_long) makes it longer (drafters/assist.py)."""
        d = self.drafter
        gated = max(getattr(d, "gate_chain", 0), getattr(d, "gate_long", 0)) if self.gate_rows else 0
        return max(self.num_draft_tokens, gated)

    @property
    def gate_rows(self) -> int:
        """The n-gram assist's gate (`_gate`): the most rows a gated step may hold, 0 for none. Unset
        (ngram_gate not given), 1 under the fixed and the adaptive policy (drafters/assist.py,
        `default_gate`): on an H200 at batch 1 it took the fixed assisted tree from 3.11x to 3.18x `ar`
        on coding (2026-12-03) and the adaptive one from 0.95 to 0.99 of the fixed (2026-12-04)."""
        gate = getattr(self.drafter, "gate", 0)
        return default_gate(getattr(self.policy, "name", None)) if gate is None else gate

    @property
    def active(self) -> int:
        return len(self.rows) + len(self.waiting)

    @property
    def free_slots(self) -> int:
        return self.max_batch - self.active

    @property
    def has_work(self) -> bool:
        return self.active > 0

    # ------------------------------------------------------------------ requests
    def add(self, request: Request) -> int:
        """Queue a request for the next step; returns its handle."""
        request.params.validate()
        vocab = self.target.spec.vocab_size
        if request.params.top_k > vocab:
            raise InvalidRequest(f"top_k must be at most the vocabulary size {vocab} (0 disables it), "
                                 f"got {request.params.top_k}")
        n = len(request.prompt)
        if n == 0:
            raise InvalidRequest("prompt is empty")
        if not all(0 <= t < vocab for t in request.prompt):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})")
        if n + request.params.max_new_tokens > self.max_len:
            raise InvalidRequest(
                f"prompt ({n} tokens) + max_new_tokens ({request.params.max_new_tokens}) exceeds the context of "
                f"{self.max_len} tokens")
        if request.top_logprobs is not None and not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}, got {request.top_logprobs}")
        spec = request.spec.validate()
        for name, value, cap in (("num_steps", spec.num_steps, self.num_steps),
                                 ("num_draft_tokens", spec.num_draft_tokens, self.num_draft_tokens)):
            if value is not None and not 1 <= value <= max(cap, 1):
                raise InvalidRequest(f"speculation.{name} must be in 1..{max(cap, 1)} on this server, got {value}")
        if self.free_slots <= 0:
            raise EngineError(f"all {self.max_batch} rows are busy")
        self._allocate()
        if not isinstance(request.stop_ids, frozenset):  # (_emit asks it once a step per row)
            request.stop_ids = frozenset(request.stop_ids)
        row = _Row(self._next_handle, request, list(request.prompt), request.params.max_new_tokens, n,
                   speculate=spec.enabled is not False and self.drafter is not None,
                   acceptance=self.policy.new_row() if self.policy is not None else None)
        self._next_handle += 1
        self.waiting.append(row)
        return row.handle

    def abort(self, handle: int) -> None:
        for r in self.waiting:
            if r.handle == handle and self.policy is not None:
                self.policy.release(r.acceptance)
        self.waiting = [r for r in self.waiting if r.handle != handle]
        for i, r in enumerate(self.rows):
            if r.handle == handle:
                self._remove([i])
                return

    def step(self) -> list[StepOutput]:
        """Prefill the requests added since the last step, then one speculative step (with
        overlap: read the step in flight and launch the next one first). Requests that join while
        a step is in flight are prefilled behind it, and the next step (their rows included) is
        launched behind their prefill before either is read: the card goes from the step to the
        prefill to the next step while the host reads (on an idle engine: `_start_behind`)."""
        outputs = []
        joined = None
        if self.waiting:
            if self._inflight is not None:
                joined = self._queue_joins()
            elif not self.overlap or self._host_drafts or self.rows:  # (a host drafter drafts from the first tokens)
                outputs += self._prefill()
            else:  # nothing in flight, no rows: the first step goes behind the prefill, before its read
                return self._start_behind(self._queue_joins())
        if not self.rows:  # the last rows finished behind a step run ahead: read it
            outputs += self._drain()
        else:
            current = self._inflight or self._launch(ahead=0)
            plan = self._plan_ahead(current)
            if plan is not None and self._gated is not None:
                plan = self._gate(current, plan)
            self._inflight = self._launch(ahead=1, plan=plan) if plan is not None else None
            if joined is not None:  # (the prefill's queueing came before this read; the card ran it before the next)
                current.unpaced = True
                if self._inflight is not None:
                    self._inflight.unpaced = True
            outputs += self._finish(current)
            if joined is not None:
                outputs += self._read_prefill(joined)
                if self._inflight is None and self.rows:  # (not run ahead: a host drafter's tokens, the cache's end)
                    self._inflight = self._launch(ahead=0)
            if not self.rows and not self.waiting:  # every row left: the step behind holds none, read it
                outputs += self._drain()
        if self._untimed and not self.rows and not self.waiting and self._inflight is None:
            self._time_untimed()  # idle now: no request waits on the timing
        return outputs

    def _start_behind(self, joined: _Joined) -> list[StepOutput]:
        """The first step of requests joining an idle engine, launched behind their prefill before
        their first tokens are read (the card goes from the prefill to the step); none where every
        one ends at its first token (a budget of 1), and read at once where they all do (a stop)."""
        if self._budget_left() > 1:
            self._inflight = self._launch(ahead=0)
            self._inflight.unpaced = True
        outputs = self._read_prefill(joined)
        if not self.rows:
            outputs += self._drain()
        return outputs

    def _cost_bucket(self, b: int, kv: int) -> None:
        """A step is planned in a bucket whose costs were not timed. Timing it captures and replays
        every tier's graph (a few hundred ms): mid-run that would stall every row, so the policy
        goes by the nearest timed bucket and this one is timed when the engine is next idle; only a
        profile without any time yet is filled at once."""
        if self.policy.cost.has_any(self.policy.tiers):
            self._untimed.add((b, kv))
        else:
            self._measure_costs(b, kv)

    def _time_untimed(self) -> None:
        cost, full = self.policy.cost, self.policy.tiers[-1]
        for b, kv in sorted(self._untimed):
            fills = self._bucket_fills(kv)
            short = len(fills) > 1 and len(cost.points(full, b, kv)) < len(fills)  # (timed mid-run: its top only)
            if short or not cost.has(b, kv, self.policy.tiers):
                self._measure_costs(b, kv)
        self._untimed.clear()

    def _drain(self) -> list[StepOutput]:
        current, self._inflight = self._inflight, None
        return self._finish(current) if current is not None else []

    def _plan_ahead(self, current: _Launch) -> tuple | None:
        """The plan of a step launched behind `current` before its result is read, or None where
        the next step must wait for it."""
        # the step behind must fit in the cache after the step in flight, which commits at most its
        # tree's depth + 1 tokens (a plain step one). A row that reaches its token budget (or a stop)
        # in the step in flight runs one step too many, dropped as after a stop: at batch 64 on an
        # H200 holding back every row near its budget kept a fifth of the steps from running ahead
        depth = self._launch_depth(current)
        if not self.overlap or self.waiting or (
                max(r.committed for r in self.rows) + depth + 1 + self.widest_nodes + 1 > self.cap):
            return None
        if self._all_end(current, depth):
            return None
        plan = self._plan(ahead=1, inflight=depth)
        # a host drafter proposes from the tokens of the step in flight: only a plain step runs ahead
        return None if self._host_drafts and plan[3] != 0 else plan

    def _all_end(self, current: _Launch, depth: int) -> bool:
        """Every row ends in the step in flight (or, having just joined, at its first token), so no
        step should run behind it: certain where each row has at most one token of budget left (a
        step gives every row one at least, as a prefill does); where each has at most the step's
        depth + 1 left and the batch is the step's, the step is waited for and read (a few steps at
        the end of a request alone: one launch's overlap lost against a whole step run for none)."""
        left = self._budget_left()
        if left <= 1:
            return True
        return left <= depth + 1 and self._same_batch(current) and self._every_row_ends(current)

    def _budget_left(self) -> int:
        """The most tokens any active row may still emit."""
        return max(r.budget - r.emitted for r in self.rows)

    def _same_batch(self, current: _Launch) -> bool:
        """The active rows are the step in flight's, in its order (none left or joined since)."""
        return len(current.rows) == len(self.rows) and all(a is r for a, r in zip(current.rows, self.rows))

    def _read_now(self, launch: _Launch) -> list:
        """A launched step's result rows as Python ints, waiting for it where it is in flight (then
        the card idles until the next launch); read once, for `_all_end`, `_gate` and `_finish`."""
        if launch.read is None:
            if launch.event is not None:
                launch.event.synchronize()
            launch.read = launch.host[:len(launch.rows)].tolist()
        return launch.read

    def _every_row_ends(self, current: _Launch) -> bool:
        """Every row of the step in flight ends on its tokens (its budget, a stop): it is read first."""
        return all(self._ends(row, self._tokens(r)) for row, r in zip(current.rows, self._read_now(current)))

    def _gate(self, current: _Launch, plan: tuple) -> tuple | None:
        """The n-gram assist's gate (drafters/assist.py, option ngram_gate): a drafting step (any tier)
        planned behind a drafting step, in a batch of at most `gate` rows, waits for that step and reads each
        row's lookup at its new root (written by the step); where every row matches, every row would
        take the lookup's chain, so the step runs without the head's tree (`LookupChain`): the same
        drafts, verify and commit at the cost of the chain's verify. The wait gives up the run-ahead
        of the steps it checks. With the ladder (option ngram_gate_long), a gated step behind a gated
        one whose rows accepted every draft runs the ladder's longer chain (`_gated_long`). Where every
        row ends in the step read (its budget, a stop), no step goes behind it (None): it would run for
        no row, and the next request's prefill would wait for it. A smaller tier's step is gated as the
        full tree's is (the lookup's chain replaces whichever tree the policy chose; to the policy a
        gated step is the full tier's, `_launch`)."""
        b, kv, sampled, tier, logprobs = plan
        rows = self.rows
        if (not tier or not current.tier or len(rows) > self.gate_rows or not self._same_batch(current)
                or not all(r.speculate for r in rows) or not all(current.drafting)):
            return plan
        if self._every_row_ends(current):  # (read now: the card idles until the launch)
            return None
        host = current.read
        if all(r[-1] == 1 for r in host):
            run = self._gated
            # the ladder where every row drafted and accepted the whole chain (out columns 0 and 2: accepted
            # with the root, drafted; a request's own draft limit cuts its chain short, and no ladder helps it)
            n = current.gated
            if self._gated_long is not None and n and all(r[2] == n and r[0] - 1 == n for r in host):
                run = self._gated_long
            nodes = 1 + self._drafters[run].num_draft
            if nodes > self.tree_nodes or tier != self._full:  # (the chain's own room: longer than the
                # tree, ngram_gate_chain, or than the smaller tier the plan's bucket was chosen for)
                before = max(r.committed for r in rows) + self._launch_depth(current) + 1
                kv = self._step_bucket(before + nodes + 1)
            return b, kv, sampled, run, logprobs
        return plan

    def _launch_depth(self, launch: _Launch) -> int:
        """The most drafts a launched step can accept on a row: its tier's depth, at most its draft
        count (the assist's full tier is as deep as its gated chain, which only a gated step drafts)."""
        if not launch.tier:
            return 0
        if launch.gated:
            return launch.gated
        t = self.policy.tiers[launch.tier - 1]
        return min(t.steps, t.num_draft)

    @property
    def _keeps_up(self) -> bool:
        """A plain step takes its token into the drafter's row state (device drafters)."""
        return len(self._drafters) > 1 and not self._host_drafts

    def _tells_first(self, b: int) -> bool:
        """A plain step of this batch bucket checks the drafter's first drafts (runtime/policy.py)."""
        return self._keeps_up and self.drafter.abilities.first_draft and b <= FIRST_DRAFT_ROWS

    @property
    def _host_drafts(self) -> bool:
        """The drafter proposes on the host (it needs the tokens of the step before)."""
        return self.drafter is not None and not self.drafter.abilities.on_device

    @property
    def layer_ids(self) -> tuple[int, ...]:
        """The target layers whose outputs the drafter reads."""
        return tuple(self.drafter.needs.capture_layers) if self.drafter is not None else ()

    def _plan(self, ahead: int, inflight: int | None = None) -> tuple:
        """The next step's shape for the active rows: (b, kv, sampled, tier, logprobs), with
        `ahead` steps in flight before it (`inflight`: their depth, where known; else the largest
        tree's); the policy picks the tier."""
        n = len(self.rows)
        b = self._batch_bucket(n) if self.buckets else n
        # the context the step reads: the rows' committed tokens, what the step in flight commits
        # (its depth + 1), then the step's own tree
        lengths = [r.committed for r in self.rows]
        grows = ahead * ((self.depth if inflight is None else inflight) + 1)
        before = max(lengths) + grows
        # each step reads its own tree's room: a plain step (the root alone, as `ar` steps) and a
        # short chain may fit a smaller bucket than the full tree, and the policy prices each so
        kvs = [self._step_bucket(before + 2)]
        sampled = any(r.request.params.temperature > 0 for r in self.rows)
        logprobs = any(r.request.top_logprobs is not None for r in self.rows)
        # no row wants drafts: a plain decode step (the drafter's state only matters to rows that draft)
        tier = 0
        self._proposal = None
        if self._catch_up(b):  # the gated step's paths first (`_fed`)
            return b, kvs[0], sampled, 0, logprobs
        if any(r.speculate for r in self.rows):
            kvs += [self._step_bucket(before + t.num_draft + 2) for t in self.policy.tiers]
            if self._measuring:
                for kv in sorted(set(kvs)):
                    if not self.policy.cost.has(b, kv, self.policy.tiers):
                        self._cost_bucket(b, kv)
            # a host drafter's step also costs the host's time (measured costs are times; static ones are not)
            timed = getattr(self.policy.cost, "measured", False)
            host_ms = self._host_ms.get(b, 0.0) if self._host_drafts and timed else 0.0
            tier = self.policy.choose(self._policy_rows(ahead, self._reach(b)), b, kvs, host_ms, draining=self.draining,
                                      context=context_hint(sum(lengths) / n + grows, kvs[-1]))
        return b, kvs[tier], sampled, tier, logprobs

    def _policy_rows(self, ahead: int, reach: int) -> list:
        """What the policy weighs per row: (record, depth cap), or None for a row that drafts nothing.
        The cap is the request's, at most `reach`: the most drafts a step of this batch can accept
        (`_reach`; the assist's gated chain is as deep as the full tier, but runs only in the gate's
        batches, so a wider batch's full tier is weighed at the tree's draft count).
        A host drafter that proposes chains is asked first where the tokens are known (no step in
        flight): a row it has nothing for counts one token, and one it has a shorter chain for is
        capped there, so the policy drafts where there is something to verify (the proposal serves
        the step). Planned behind a step in flight, each row also carries its chance of a proposal
        (a third item): its share of proposals so far."""
        if not self._propose_first:
            if reach >= self.depth:
                return [(r.acceptance, r.depth_cap) if r.speculate else None for r in self.rows]
            return [(r.acceptance, min(r.depth_cap, reach)) if r.speculate else None for r in self.rows]
        if ahead:
            return [(r.acceptance, r.depth_cap, r.match_rate) if r.speculate else None for r in self.rows]
        t0 = time.perf_counter()
        tree = self._propose(self.drafter)
        self._proposal = (tree, time.perf_counter() - t0)
        if tree.offered is None:
            return [(r.acceptance, r.depth_cap) if r.speculate else None for r in self.rows]
        out = []
        for r, n in zip(self.rows, tree.offered):
            if r.speculate:
                r.match_rate += 0.1 * ((n > 0) - r.match_rate)
            out.append((r.acceptance, min(r.depth_cap, n)) if r.speculate and n > 0 else None)
        return out

    @property
    def _propose_first(self) -> bool:
        """A host drafter of chains under the adaptive policy: its proposal comes before the choice."""
        return (self._host_drafts and not self.drafter.abilities.trees
                and getattr(self.policy, "name", None) == "adaptive")

    def _launch(self, ahead: int, plan: tuple | None = None) -> _Launch:
        """Queue one step for the active rows; `ahead` steps are in flight before it (`plan`:
        its plan, where the caller made it already: the policy chooses once a step)."""
        n = len(self.rows)
        b, kv, sampled, run, logprobs = plan or self._plan(ahead)
        # a gated step (the chain's drafts; 0 for any other) is the full tree's, to the policy
        gated = self._drafters[run].num_draft if run in (self._gated, self._gated_long) else 0
        tier = self._full if gated else run
        proposal, self._proposal = self._proposal, None  # made with this plan, or None
        t0 = time.perf_counter()  # the host's share of the step (a bucket's first plan may time its graphs)
        offered = None
        if tier and self._host_drafts:
            tree = self._host_tree(n, b, tier, proposal[0] if proposal else None)
            offered = tree.offered
            t0 -= proposal[1] if proposal else 0.0
        out = self._run(b, kv, sampled, run, logprobs)
        self._drafted = tier > 0
        self._gated_last = 0 if not gated else 3 if run == self._gated_long else 2
        self._narrow_last = not gated and tier != self._full
        if b > n:  # padding rows stepped too: back to an empty context, far from the bucket's end
            self.committed[n:b] = 0
            if self.drafter is not None:
                self.drafter.park_rows(n, b)
        host = self._host_out[self._flip]
        host_lp = None
        if logprobs:
            host_lp = tuple(h[:n] for h in self._host_lp[self._flip])
            for dst, src in zip(host_lp, self.step_lp):
                dst.copy_(src[:n], non_blocking=True)
        self._flip ^= 1
        host[:n].copy_(out[:n], non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        if any(r.speculate for r in self.rows):  # (once queued: behind the assist's gate the card waits on this launch)
            self.policy.launched(tier)
        return _Launch(list(self.rows), host, event, host_lp, tier, [r.speculate for r in self.rows], b,
                       time.perf_counter() - t0, offered, bool(ahead), gated)

    def _finish(self, launch: _Launch) -> list[StepOutput]:
        """Read a launched step's result (the one host sync of a step) and emit its tokens."""
        if launch.event is not None:
            launch.event.synchronize()
        t0 = time.perf_counter()
        if launch.event is not None and self.policy is not None:
            # the time since the step before was read, where both ran ahead with the same tier and
            # bucket (no prefill between): the pace the card or the host (whichever is slower) keeps
            # (AdaptivePolicy.paced)
            key = (launch.tier, launch.batch) if launch.ahead and not (launch.gated or launch.unpaced) else None
            if key is not None and key == self._read_key:
                self.policy.paced(launch.tier, launch.batch, 1000.0 * (t0 - self._read_at))
            self._read_at, self._read_key = t0, key
        tree = self.policy.tiers[launch.tier - 1] if launch.tier else None
        depth = self._launch_depth(launch)
        seen = ([], [], [])  # the policy's records of the rows that drafted, depths offered, drafts accepted
        # the rows' first-draft checks of a plain step: records, hits (a custom policy may not take them)
        firsts = ([], []) if (launch.tier == 0 and self._tells_first(launch.batch)
                              and hasattr(self.policy, "observe_first")) else None
        outputs, done = [], []
        lp = [t.tolist() for t in launch.host_logprobs] if launch.host_logprobs is not None else None
        for i, (row, res) in enumerate(zip(launch.rows, self._read_now(launch))):
            if row.finished:  # it left after this step was launched
                continue
            n_acc, drafted = res[0], res[2]
            row.committed += n_acc
            new, reason = self._emit(row, self._tokens(res))
            out = StepOutput(row.handle, new, reason, drafted, n_acc - 1, n_acc, res[3])
            if not row.speculate:
                out.no_draft_reason = "auto" if row.request.spec.enabled == "auto" else "request"
            if tree is not None and launch.drafting[i]:
                out.draft_tree = tree
                # (a step offers what it could accept: the gated chain's depth only where it was gated)
                offered = min(depth, row.depth_cap, launch.offered[i] if launch.offered else depth)
                if offered > 0:  # (a row its host drafter had nothing for tells the policy nothing)
                    seen[0].append(row.acceptance)
                    seen[1].append(offered)
                    seen[2].append(n_acc - 1)
            elif firsts is not None and launch.drafting[i]:
                firsts[0].append(row.acceptance)
                firsts[1].append(res[-1])
            if reason is None and self.drafter is not None and row.request.spec.enabled == "auto":
                self._auto(row, drafted, n_acc - 1)
            if lp is not None and row.request.top_logprobs is not None:
                out.logprobs = self._logprobs(row, lp[0][i], lp[1][i], lp[2][i], len(new))
            outputs.append(out)
            if reason is not None:
                done.append(row)
        if tree is not None:
            self.policy.observe(seen[0], launch.tier, seen[1], seen[2])
        elif firsts is not None and firsts[0]:
            self.policy.observe_first(*firsts)
        self._remove([self.rows.index(r) for r in done])
        if launch.tier and self._host_drafts and launch.event is not None:
            # a host drafter's step cannot overlap the host's work: the card waits for it
            ms = 1000 * (launch.host_s + time.perf_counter() - t0)
            old = self._host_ms.get(launch.batch)
            self._host_ms[launch.batch] = ms if old is None else old + 0.1 * (ms - old)
        return outputs

    def _set_limits(self, index: int, row: _Row) -> None:
        """Row `index`'s tree limits on the device: the request's (capped by the engine's), or no drafts."""
        spec, n_draft = row.request.spec, self.widest_nodes - 1
        on = row.speculate
        row.depth_cap = min(spec.num_steps or self.depth, self.depth) if on else 0
        self.depth_limit[index].fill_(row.depth_cap)  # (fill_, not `= number`: no wait for a step in flight)
        self.draft_limit[index].fill_(1 + min(spec.num_draft_tokens or n_draft, n_draft) if on else 1)

    def _auto(self, row: _Row, drafted: int, accepted: int) -> None:
        """enabled "auto": average the row's acceptance; switch drafting off below the threshold
        (after a full window) and back on for a probe after probe_every plain steps. A step
        already in flight keeps the limits it was launched with."""
        spec = row.request.spec
        if row.speculate:
            if drafted == 0:
                return
            rate = accepted / drafted
            a = 2.0 / (spec.window + 1)
            row.accept_ema = rate if row.accept_ema is None else row.accept_ema + a * (rate - row.accept_ema)
            row.drafting_steps += 1
            if row.drafting_steps >= spec.window and row.accept_ema < spec.min_acceptance:
                row.speculate, row.plain_steps = False, 0
                self._set_limits(self.rows.index(row), row)
        else:
            row.plain_steps += 1
            if row.plain_steps >= spec.probe_every:
                row.speculate, row.accept_ema, row.drafting_steps = True, None, 0
                self._set_limits(self.rows.index(row), row)

    @staticmethod
    def _logprobs(row: _Row, chosen: list, top_val: list, top_idx: list, n: int) -> list:
        """The first n emitted tokens' (log-probability, top alternatives), path position by position."""
        k = row.request.top_logprobs
        return [(chosen[j], list(zip(top_idx[j][:k], top_val[j][:k]))) for j in range(n)]

    def generate(self, prompts: list[list[int]], params: SamplingParams, stop_ids=(),
                 progress=None) -> list[GenerationResult]:
        """Every prompt to the end (stop token, max_new_tokens, or the cache's end), at most
        max_batch at a time: a finished row takes the next prompt. `progress(n)` is called
        with the number of prompts that finished at each step."""
        params.validate()
        for i, p in enumerate(prompts):
            if not p:
                raise EngineError(f"prompt {i} is empty")
            if len(p) >= self.max_len:
                raise EngineError(f"prompt {i} has {len(p)} tokens; the cache holds {self.max_len} (prompt + output)")
        if self.has_work:
            raise EngineError("generate() needs an idle engine; this one is serving requests")
        base = params.seed if params.seed is not None else random.getrandbits(32)
        todo = deque(range(len(prompts)))
        of_handle, results, admitted = {}, [None] * len(prompts), {}
        stops = frozenset(stop_ids)
        try:
            while todo or self.has_work:
                while todo and self.free_slots > 0:
                    i = todo.popleft()
                    p = replace(params, seed=base + 1_000_003 * i,
                                max_new_tokens=min(params.max_new_tokens, self.max_len - len(prompts[i])))
                    h = self.add(Request(prompts[i], p, stops))
                    of_handle[h] = i
                    results[i] = GenerationResult([], "", accept_per_position=[0] * (self.num_steps + 1))
                    admitted[h] = time.perf_counter()
                self.draining = not todo
                for out in self.step():
                    r = results[of_handle[out.handle]]
                    r.token_ids += out.new_tokens
                    if not out.prefill:
                        r.steps += 1
                        accepted = out.accepted
                        if out.finish_reason is not None:  # only what the last step produced: its tokens, a stop
                            accepted = min(accepted, max(len(out.new_tokens) + (out.finish_reason == "stop") - 1, 0))
                        r.accepted_tokens += accepted
                        tree = str(out.draft_tree) if out.draft_tree is not None else "none"
                        r.steps_by_tree[tree] = r.steps_by_tree.get(tree, 0) + 1
                        for k in range(1, accepted + 1):
                            r.accept_per_position[k] += 1
                    if out.finish_reason:
                        r.finish_reason = out.finish_reason
                        r.seconds = time.perf_counter() - admitted[out.handle]
                        if progress is not None:
                            progress(1)
        finally:
            self.draining = False
        return results

    # ------------------------------------------------------------------ state
    def _allocate(self) -> None:
        if self._allocated:
            return
        dev = self.device
        # rows [:max_batch] decode; row max_batch stages a lone joining prompt, so that its
        # captured prefill graph serves whichever row the request lands in (see _prefill)
        self.staging = self.max_batch
        mb = self.max_batch + 1
        self.tree_nodes = 1 + self.num_draft_tokens
        self.widest_nodes = 1 + self.max_drafts  # (more where the assist's gated steps verify a longer chain)
        self.depth = self.num_steps
        self.cap = self._cache_len()
        self._check_memory(mb)
        self.cache = KVCache(self.target.spec, mb, self.cap, self.dtype, dev)
        # the rows' small state in two blocks, one per dtype, each tensor a row of them: a row that moves
        # or clears is one launch a block (`_move_row`, `_clear_row`), not one a tensor
        longs = torch.zeros(6, mb, dtype=torch.long, device=dev)
        self.committed, self.root, self.depth_limit, self.draft_limit = longs[:4]
        self.row_params = RowParams.allocate(mb, dev, longs=longs[4:])
        self._row_blocks = (longs, self.row_params.floats)
        self.base = torch.zeros(mb, dtype=torch.long, device=dev)  # a step's committed length before it
        # a plain decode step's tree, the root alone (made here: a captured step launches nothing for it)
        self._lone = Tree(self.root[:, None], torch.full((mb, 1), -1, dtype=torch.long, device=dev),
                          torch.zeros(mb, 1, dtype=torch.long, device=dev), torch.ones(mb, 1, dtype=torch.bool, device=dev), 0)
        # per row: accepted count (with the root), bonus, drafted count, depth offered, path tokens,
        # and last a plain step's first-draft check (1: the target's token equals the drafter's first
        # draft; 0: it does not, or the drafter had none, as a drafting step counts an empty draft;
        # `_tells_first`)
        self.out = torch.zeros(mb, 4 + self.depth + 1 + 1, dtype=torch.long, device=dev)
        pinned = dev.type == "cuda"
        self._host_out = [torch.zeros(mb, self.out.shape[1], dtype=torch.long, pin_memory=pinned) for _ in range(2)]
        self._host_first = torch.zeros(mb, dtype=torch.long, pin_memory=pinned)  # joining prompts' first tokens
        # log-probabilities at each path position of a step (filled by steps of requests that ask)
        d, k = self.depth + 1, MAX_TOP_LOGPROBS
        self.step_lp = (torch.zeros(mb, d, device=dev), torch.zeros(mb, d, k, device=dev),
                        torch.zeros(mb, d, k, dtype=torch.long, device=dev))
        self._host_lp = [tuple(torch.zeros(t.shape, dtype=t.dtype, pin_memory=pinned) for t in self.step_lp)
                         for _ in range(2)]
        self._flip = 0
        if self.drafter is not None:
            self.drafter.allocate(mb, self.cap, dev, self.dtype)
        # per tier (index 0: none) the drafter of its tree; the last tier, the full tree, is the drafter itself
        tiers = self.policy.tiers if self.policy is not None else []
        self._drafters = [None] + [self.drafter.tier(t) for t in tiers[:-1]] + [self.drafter] * bool(tiers)
        # the gate (`_gate`): a drafting step without the head's tree, where every row takes the
        # lookup's chain; run as a graph of its own, observed as the full tree's step
        self._full, self._gated, self._gated_long = len(tiers), None, None
        if tiers and self.gate_rows and not self._host_drafts:
            self._drafters.append(self.drafter.lookup_only())
            self._gated = len(self._drafters) - 1
            if getattr(self.drafter, "gate_long", 0):  # the ladder's chain (`_gate`)
                self._drafters.append(self.drafter.lookup_only(long=True))
                self._gated_long = len(self._drafters) - 1
            # the batch buckets a gated step can run in (their drafting steps tell the next root's lookup)
            self._gate_rows = self._batch_bucket(self.gate_rows) if self.buckets else self.gate_rows
        self._narrow_width = self._narrow_feed(tiers)
        if self._host_drafts:  # its trees are copied into these inputs
            # a well-formed tree in every row from the start (the root at depth 0, drafts invalid):
            # rows no request has used yet still step inside a padded batch and in graph capture,
            # and a root at depth 1 made their accepted path start at node -1 (the commit then read
            # the slot before the cache: an illegal address in row 0)
            n = self.tree_nodes
            parents = torch.zeros(mb, n, dtype=torch.long, device=dev)
            parents[:, 0] = -1
            depth = torch.ones(mb, n, dtype=torch.long, device=dev)
            depth[:, 0] = 0
            self.tree_in = Tree(torch.zeros(mb, n, dtype=torch.long, device=dev), parents, depth,
                                torch.zeros(mb, n, dtype=torch.bool, device=dev), self.depth,
                                torch.zeros(mb, n, dtype=torch.long, device=dev))
        self.graphs: dict = {}
        self._pool = None
        self._allocated = True

    def _cache_len(self) -> int:
        """Slots per cache row: the context, room to verify a full tree at its end, a spare slot,
        rounded up to a multiple of 16 (the longest context bucket: a kernel's integer arguments then
        divide by 16 in every bucket, as Triton specializes them, so that bucket compiles no variants
        of its own)."""
        return -(-(self.max_len + 1 + self.max_drafts + 2) // 16) * 16

    def memory_plan(self, rows: int | None = None) -> dict[str, int]:
        """Bytes the engine allocates for `rows` cache rows (default: max_batch + the staging
        row): the target's KV cache, the drafter's state, and a step's largest temporaries
        (the verify's logits in float32 and the attention's split-K partials, a rough bound)."""
        spec = self.target.spec
        rows = rows or self.max_batch + 1
        cap = self._cache_len()
        elem = torch.tensor([], dtype=self.dtype).element_size()
        kv = 2 * spec.num_hidden_layers * rows * spec.num_key_value_heads * cap * spec.head_dim * elem
        drafter = self.drafter.memory_bytes(rows, cap, elem) if self.drafter is not None else 0
        tokens = rows * (1 + self.max_drafts)
        step = tokens * (spec.vocab_size * (4 + elem) + 8 * spec.hidden_size * elem) + tokens * cap * 2
        return {"kv_cache": kv, "drafter": drafter, "step": step}

    def _check_memory(self, rows: int) -> None:
        """Refuse, before allocating, a cache the card cannot hold (a clear error instead of an
        out-of-memory error or a fault in a later step)."""
        if self.device.type != "cuda":
            return
        plan = self.memory_plan(rows)
        need = sum(plan.values())
        free, total = torch.cuda.mem_get_info(self.device)
        if need > free:
            gib = 2**30
            parts = ", ".join(f"{k.replace('_', ' ')} {v / gib:.2f} GiB" for k, v in plan.items())
            per_row = need / rows
            fits = max(int(free // per_row) - 1, 0)
            raise EngineError(
                f"max_batch {self.max_batch} x max_len {self.max_len} needs {need / gib:.1f} GiB ({parts}); the GPU has "
                f"{free / gib:.1f} of {total / gib:.1f} GiB free: lower --max-batch (about {fits} fit at this max_len) "
                f"or --max-len")

    def _state(self) -> list[torch.Tensor]:
        """Per-row tensors a step changes; graph warm-up restores them."""
        extra = self.drafter.state() if self.drafter is not None else []
        return [self.committed, self.root, self.out] + extra

    def _prefill(self) -> list[StepOutput]:
        """The waiting prompts prefilled, their first tokens read (one sync)."""
        return self._read_prefill(self._queue_joins())

    def _queue_joins(self) -> _Joined:
        """Queue the waiting prompts' prefills (they join `self.rows`), in groups of at most
        `prefill_tokens` padded tokens (one forward each: 512 joining prompts of 2,000 tokens would
        otherwise make one forward of a million tokens, with attention tensors past what int32
        indexing and the card's memory hold), and their first tokens' copy to the host behind
        them, read by `_read_prefill`. A group of at most STAGED_PREFILL_PROMPTS prompts goes one
        prompt at a time through the captured prefill of its width in the staging row: the host's
        work for the next prompt (its row's settings and inputs, the launch, the row's move)
        overlaps the card's prefill of the one before."""
        new, self.waiting = self.waiting, []
        firsts, lps = [], []
        try:
            for group in prefill_groups([len(r.request.prompt) for r in new], self.prefill_tokens):
                part = [new[i] for i in group]
                if self.buckets and len(part) <= STAGED_PREFILL_PROMPTS:
                    for r in part:
                        first, lp = self._queue_prefill([r])
                        firsts.append(first.clone())  # (the graph's output: the next prompt's replay writes it again)
                        lps += lp
                else:  # these prompts in one forward, in their own rows
                    first, lp = self._queue_prefill(part)
                    firsts.append(first)
                    lps += lp
        except BaseException:  # (a failed capture or allocation: what did not join waits again, so an abort finds it)
            joined = {id(r) for r in self.rows}
            self.waiting = [r for r in new if id(r) not in joined] + self.waiting
            raise
        host = self._host_first[: len(new)]
        host.copy_(torch.cat(firsts), non_blocking=True)
        event = None
        if self.device.type == "cuda":  # (a step launched behind the prefill is not waited for)
            event = torch.cuda.Event()
            event.record()
        return _Joined(new, host, event, lps)

    def _queue_prefill(self, new: list[_Row]) -> tuple[torch.Tensor, list]:
        """Queue the prefill of these prompts into the next rows (they join `self.rows`): their
        first tokens on the device, and per prompt its first token's logprobs (read here, where
        asked) or None."""
        start, k = len(self.rows), len(new)
        dev = self.device
        lengths = [len(r.request.prompt) for r in new]
        width = max(lengths)
        staged = self.buckets and k == 1
        if staged:
            # one request joining (the common case): its width rounds up to a bucket and it is
            # prefilled in the staging row, then moved to its row; on CUDA the prefill replays a
            # graph captured per width alone (eager, the Triton launches alone cost ~12 ms of host
            # time for a 30-layer prompt forward; per row and width, a server would capture
            # hundreds). Padding writes past the prompt, into slots no query sees before they
            # are written again.
            width = self._width_bucket(width)
        row0 = self.staging if staged else start
        # (pinned on CUDA: their copies to the card wait for nothing, not for a step in flight)
        pinned = dev.type == "cuda"
        ids = torch.zeros(k, width, dtype=torch.long, pin_memory=pinned)
        for i, r in enumerate(new):
            ids[i, : lengths[i]] = torch.as_tensor(r.request.prompt)
        lens = torch.tensor(lengths, pin_memory=pinned)
        for i, r in enumerate(new):
            p = r.request.params
            seed = p.seed if p.seed is not None else random.getrandbits(32)
            self.row_params.set_row(row0 + i, p, seed)
            self._set_limits(row0 + i, r)
        sampled = any(r.request.params.temperature > 0 for r in new)
        logprobs = any(r.request.top_logprobs is not None for r in new)
        if staged and self.use_graphs:
            graph, inputs, first = self._prefill_graph(width, sampled, logprobs)
            for buf, src in zip(inputs, (ids, lens)):
                buf.copy_(src, non_blocking=True)
            graph.replay()
        else:
            with torch.no_grad():
                first = self._prefill_forward(row0, ids.to(dev, non_blocking=True), lens.to(dev, non_blocking=True),
                                              sampled, logprobs)
        if staged:
            self._move_row(self.staging, start, width)
        if hasattr(self.policy, "prime"):  # while the card prefills (its first tokens are read next)
            joining = [r for r in new if r.speculate]
            n = len(self.rows) + len(new)  # (the caps the next plan tells: `_policy_rows`)
            reach = self._reach(self._batch_bucket(n) if self.buckets else n)
            self.policy.prime([r.acceptance for r in joining], [min(r.depth_cap, reach) for r in joining])
        lps = [None] * k
        if logprobs:  # the prefill wrote them at path position 0 (of the staging row: copied before the next
            # prefill writes it; read with the first tokens, `_read_prefill`)
            lp = [t[row0: row0 + k, :1].to("cpu", non_blocking=True, copy=True) for t in self.step_lp]
            lps = [(lp[0][i], lp[1][i], lp[2][i]) for i in range(k)]
        self.rows += new
        return first, lps

    def _read_prefill(self, joined: _Joined) -> list[StepOutput]:
        """The joined rows' first tokens (a sync on their prefill alone), emitted; rows that finish
        at once leave (a step launched behind the prefill has run them one step too many)."""
        if joined.event is not None:
            joined.event.synchronize()
        outputs, done = [], []
        for r, tok, lp in zip(joined.rows, joined.host.tolist(), joined.lps):
            toks, reason = self._emit(r, [tok])
            out = StepOutput(r.handle, toks, reason, accept_length=1, prefill=True)
            if lp is not None and r.request.top_logprobs is not None:
                out.logprobs = self._logprobs(r, *(t.tolist() for t in lp), len(toks))
            outputs.append(out)
            if reason is not None:
                done.append(r)
        self._remove([self.rows.index(r) for r in done])
        return outputs

    def _prefill_graph(self, width: int, sampled: bool, logprobs: bool = False):
        """The captured prefill of one prompt of `width` (a bucket) into the staging row: (graph,
        its input buffers (ids [1, W], lengths [1]), its output), captured on first use."""
        key = ("prefill", width, sampled) + ((True,) if logprobs else ())
        if key not in self.graphs:
            inputs = (torch.zeros(1, width, dtype=torch.long, device=self.device),
                      torch.ones(1, dtype=torch.long, device=self.device))
            graph, first = capture_graph(lambda: self._prefill_forward(self.staging, *inputs, sampled, logprobs),
                                         self._pool, self._restorer(), self.capture_warmups)
            self._pool = graph.pool()
            self.graphs[key] = (graph, inputs, first)
        return self.graphs[key]

    def _restorer(self):
        """A function that puts the rows' small state back as it is now (graph warm-ups run
        real steps; they must leave no trace)."""
        state = self._state()
        saved = [t.clone() for t in state]

        def restore():
            for t, s in zip(state, saved):
                t.copy_(s)
        return restore

    def capture_common(self, batch_sizes=(1,)) -> int:
        """Capture now what requests of these batch sizes replay at temperature 0 (a server
        calls it at start, so no request pays a capture): the step graph of every context
        bucket and tier (none, the policy's tiers), and the prefill graph of every prompt-width
        bucket; with an adaptive policy whose costs are measured here, each bucket's steps are
        timed too (`_measure_costs`). Sampled steps are still captured on first use. Returns the
        number of graphs captured; `graph_report` says which, in what time and memory."""
        if self.rows or self.waiting:
            raise EngineError("capture_common() needs an idle engine")
        if not self.use_graphs:
            return 0
        self._allocate()
        t0 = time.perf_counter()
        cuda = self.device.type == "cuda"
        if cuda:  # what an engine made before in this process (start-up froze it) is freed first, so
            # that its graphs' pools, released during this capture, do not count against this one's
            # (an H200 printed "graph memory -72 MiB" for an engine built after three others)
            gc.unfreeze()
            gc.collect()
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()  # (a freed graph's pool goes back to the card here, not mid-capture)
        reserved = torch.cuda.memory_reserved(self.device) if cuda else 0
        before = len(self.graphs)
        batches, kvs, buckets, widths = self._capture_plan(batch_sizes)
        compiled = self.compile_kernels(batch_sizes)
        if cuda and compiled is not None and "skipped" not in compiled:  # (the dry run's memory is not the graphs')
            reserved = torch.cuda.memory_reserved(self.device)
        measure_s = 0.0
        for b, kv, keys in buckets:
            for key in keys:
                if key not in self.graphs:
                    self.graphs[key] = self._capture(*key)
            if self._measuring and not self.policy.cost.has(b, kv, self.policy.tiers):
                t1 = time.perf_counter()
                self._measure_costs(b, kv)
                measure_s += time.perf_counter() - t1
        for width in widths:
            self._prefill_graph(width, False)
        n = len(self.graphs) - before
        tiers = [str(t) for t in self.policy.tiers] if self.policy is not None else []
        self.graph_report = {
            "graphs": n, "policy": self.policy.name if self.policy is not None else None, "tiers": tiers,
            "batch_buckets": batches, "context_buckets": kvs, "prefill_widths": widths,
            "graph_memory_mib": round((torch.cuda.memory_reserved(self.device) - reserved) / 2**20, 1) if cuda else 0.0,
            "seconds": round(time.perf_counter() - t0, 2), "measure_seconds": round(measure_s, 2),
            "compile_ahead": compiled}
        # what start-up made (the modules, the graphs' state, the tokenizer's) lives on: keep it out
        # of the collector's later passes, so that no step waits on a pass over it (one took 0.19 s
        # over the 410k objects of SmolLM2 and its head, on a 2-core CPU host)
        gc.collect()
        gc.freeze()
        return n

    def compile_kernels(self, batch_sizes=(1,)) -> dict | None:
        """Compile now, in parallel, the Triton kernels of the greedy graphs that requests of these
        batch sizes replay (what capture_common captures), without capturing any: a dry run of
        each (`_compile_ahead`, kernels/ahead.py), then a mark in Triton's cache so that a later
        start of the same engine skips it. capture_common calls it first; an engine whose graphs
        are captured on first use (scripts/bench.py's) may call it before its first request, to
        compile in parallel what that request would compile one kernel after another. Returns
        the dry run's report: None on a CPU, without a Triton that compiles in threads or under
        SPECHEADS_COMPILE_AHEAD=0; {"skipped": ...} where this machine compiled them before."""
        if self.rows or self.waiting:
            raise EngineError("compile_kernels() needs an idle engine")
        if not self.use_graphs or not self.compile_ahead or not ahead.available():
            return None
        self._allocate()
        _, _, buckets, widths = self._capture_plan(batch_sizes)
        report = self._compile_ahead(buckets, widths)
        if report is not None and "skipped" not in report:
            if self.device.type == "cuda":  # (what the dry run held goes back to the card)
                torch.cuda.synchronize(self.device)
                torch.cuda.empty_cache()
            ahead.mark_compiled(self._kernel_fingerprint, buckets, widths)  # (a later start skips the dry run)
        return report

    def _capture_plan(self, batch_sizes):
        """(batch buckets, context buckets, [(batch, context, step graph keys)], prompt widths) of
        the greedy graphs capture_common captures for these batch sizes."""
        kvs = sorted({self._context_bucket(need) for need in range(1, self.cap + 1)})
        batches = sorted({self._batch_bucket(n) for n in batch_sizes})
        buckets = [(b, kv, self._bucket_keys(b, kv)) for b in batches for kv in kvs]
        widths = sorted({self._width_bucket(n) for n in range(1, self.max_len + 1)})
        return batches, kvs, buckets, widths

    def _bucket_keys(self, b: int, kv: int) -> list[tuple]:
        """The greedy step graphs capture_common captures for batch bucket b and context bucket kv:
        every tier (0: plain), the gate's chains in the gate's batches, the plain step after a
        drafting one, and the variants after a gated step."""
        keys = [(b, kv, False, tier) for tier in range(self._full + 1)]
        gates = [g for g in (self._gated, self._gated_long) if g is not None]
        if gates and b <= self._gate_rows:
            keys += [(b, kv, False, g) for g in gates]
        if self._keeps_up:  # and the plain step after a drafting one
            keys.append((b, kv, False, 0, False, 1))
        # after a gated step (`_fed`): every step in the gate's batches, a plain catch-up in wider ones
        steps = [*range(1, self._full + 1), *gates] if gates and b <= self._gate_rows else []
        for wide in (2, 3)[: len(gates)]:
            keys += [(b, kv, False, t, False, wide) for t in [0, *steps]]
        if self._narrows(b):  # a smaller tier behind a smaller tier (`_narrow_feed`)
            keys += [(b, kv, False, t, False, 4) for t in range(1, self._full)]
        return keys

    def _kernel_fingerprint(self, buckets, widths) -> dict:
        """What decides the kernel variants a capture_common launches: the graphs and tree shapes,
        the shapes and dtypes of the target's and the drafters' weights, and the kernel tuning."""
        def modules(obj, depth=0):
            for v in vars(obj).values():
                if isinstance(v, torch.nn.Module):
                    yield v
                elif depth < 2 and type(v).__module__.startswith("specheads.drafters"):
                    yield from modules(v, depth + 1)
        mods = {id(self.target): self.target}
        for d in self._drafters:
            if d is not None:
                mods.update((id(m), m) for m in modules(d))
        weights = [[name, list(t.shape), str(t.dtype)] for m in mods.values() for name, t in m.state_dict().items()]
        trees = [[type(d).__name__, getattr(d, "num_draft", 0), getattr(d, "depth", 0)] for d in self._drafters
                 if d is not None]
        return {"method": self.method, "trees": trees, "graphs": [list(map(str, k)) for _, _, keys in buckets
                                                                 for k in keys],
                "widths": widths, "max_len": self.max_len, "weights": weights, "tuning": active_tuning().to_dict()}

    def _compile_ahead(self, buckets, widths) -> dict | None:
        """Before capture_common captures, compile the kernel variants its graphs will launch, in
        parallel (kernels/ahead.py): a dry run of every step and prefill graph to be captured, its
        kernel ops computed by their torch references while their Triton launches only compile.
        Skipped where this machine's Triton cache already holds this engine's kernels (a marker
        there, left by the last start that compiled them). A dry run that fails costs its time
        only: the capture compiles what it did not. Returns its report (None where there was
        nothing to do). `compile_kernels` decides whether it runs."""
        todo = [key for _, _, keys in buckets for key in keys if key not in self.graphs]
        prefills = [w for w in widths if ("prefill", w, False) not in self.graphs]
        if not todo and not prefills:
            return None
        if ahead.compiled_before(self._kernel_fingerprint, buckets, widths):
            return {"skipped": "this machine's Triton cache holds these kernels (compiled at an earlier start)"}
        restore = self._restorer()
        try:
            with ahead.compile_ahead() as report, torch.no_grad():
                for key in todo:
                    self._step(*key)
                    restore()
                for width in prefills:
                    ids = torch.zeros(1, width, dtype=torch.long, device=self.device)
                    self._prefill_forward(self.staging, ids, torch.ones(1, dtype=torch.long, device=self.device),
                                          False, False)
                    restore()
        except Exception as e:  # only the start-up's speed is at stake
            restore()
            return {"error": f"{type(e).__name__}: {e}"[:500]}
        return report.to_dict()

    def graph_summary(self) -> str:
        """One line on what `capture_common` captured (for a server's start-up log)."""
        r = self.graph_report
        if not r:
            return "no CUDA graphs captured"
        tiers = f" x {1 + len(r['tiers'])} trees (plain, {', '.join(r['tiers'])})" if r["tiers"] else ""
        measured = f", step costs timed in {r['measure_seconds']:.1f} s" if r["measure_seconds"] else ""
        a = r.get("compile_ahead") or {}
        if "variants" in a:
            failed = f", {a['failed_ops']} kernel ops left to the capture" if a["failed_ops"] else ""
            where = (f"{a['processes']} processes" if a.get("processes") else f"{a['workers']} threads")
            split = (f" (dry run {a['dry_seconds']:.1f} s; the processes' first answer at "
                     f"{a['first_compiled_seconds']:.1f} s, last at {a['compiled_seconds']:.1f} s)"
                     if a.get("compiled_seconds") is not None else "")
            measured += (f"; {a['variants']} kernel variants compiled ahead in {where} in {a['seconds']:.1f} s"
                         f"{split}{failed}")
        elif "error" in a:
            measured += f"; kernels compiled one by one (the dry run failed: {a['error']})"
        elif "skipped" in a:
            measured += "; kernels from the Triton cache"
        return (f"captured {r['graphs']} CUDA graphs ({len(r['batch_buckets'])} batch x {len(r['context_buckets'])} "
                f"context buckets{tiers}, {len(r['prefill_widths'])} prompt widths) in {r['seconds']:.1f} s"
                f"{measured}; graph memory {r['graph_memory_mib']:.0f} MiB")

    MEASURE_REPEATS = 5

    def _measure_costs(self, b: int, kv: int) -> None:
        """Time the plain step and each tier's step at batch bucket b and context bucket kv (the
        adaptive policy's costs): each captured greedy graph replayed with rows [:b] at the longest
        context the bucket holds and at its shortest (`_bucket_fills`), the rows' state put back
        after each replay as after a graph's warm-up (a replay writes only cache slots past each
        row's context); the median of MEASURE_REPEATS replays after one to warm up. The policy
        prices a step on the line through the two at its rows' mean context: attention reads each
        row's own keys, so a step costs about linearly in the rows' tokens whatever its bucket (an
        H200 at batch 32, the full assisted tree: 2.50 ms at no context, then 1.1-1.2 ms more a
        thousand tokens in every bucket from 128 to 2048), and a bucket holding its longest row
        overprices its other rows (coding at batch 32, bucket 2048: 4.97 ms timed at the top, its
        steps ran 2.88 ms apart). Saved to the profile path if one was given."""
        graphs = []
        for tier in range(self._full + 1):  # (not the gate's graph: no tier of the policy's)
            key = (b, kv, False, tier)
            if 0 < tier < self._full and self._narrows(b):
                key += (False, 4)  # (a smaller tier runs behind smaller ones: its narrow feed, `_narrow_feed`)
            if key not in self.graphs:
                self.graphs[key] = self._capture(*key)
            graphs.append(self.graphs[key])
        restore = self._restorer()
        fills = self._bucket_fills(kv)
        if self.rows:  # a replay writes the cache past `fill`: below the top it would overwrite a row's
            fills = fills[-1:]  # context, so only the top is timed now and the rest once the engine is idle
            self._untimed.add((b, kv))
        timed = {(i, fill): [] for i in range(len(graphs)) for fill in fills}
        # (a draft that stops early on what the rows hold now would time a step shorter than most)
        with self.drafter.full_drafts():
            for repeat in range(1 + self.MEASURE_REPEATS):
                for (i, fill), pairs in timed.items():
                    self.committed[:b] = fill
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    graphs[i].replay()
                    end.record()
                    restore()
                    if repeat:
                        pairs.append((start, end))
            torch.cuda.synchronize(self.device)
        tiers = [None, *self.policy.tiers]
        for (i, fill), pairs in timed.items():
            ms = statistics.median(s.elapsed_time(e) for s, e in pairs)
            if fill == fills[-1]:
                self.policy.cost.add(tiers[i], b, kv, ms)
            if len(fills) > 1:
                self.policy.cost.add_point(tiers[i], b, kv, fill, ms)
        if self._profile_path is not None:
            self.policy.cost.save(self._profile_path)

    def _bucket_fills(self, kv: int) -> list[int]:
        """The rows' tokens at which a step of context bucket kv is timed, ascending: about half the
        bucket (the least its longest row holds; none in the smallest bucket) and the most (the
        full tree's tokens fill it); one where they meet. The policy carries the line through them
        down to the rows' mean (`SpeculationProfile.step`)."""
        top = max(kv - self.tree_nodes - 1, 0)
        below = kv // 2 if kv > MIN_CONTEXT_BUCKET else 0
        low = min(max(below - self.tree_nodes - 1, 0), top)
        return [low, top] if low < top else [top]

    # graphs are captured per bucket: batch, context and prompt widths round up to powers of two
    def _batch_bucket(self, n: int) -> int:
        return min(next_pow2(n), self.max_batch)

    def _context_bucket(self, need: int) -> int:
        return min(max(next_pow2(need), MIN_CONTEXT_BUCKET), self.cap)

    def _step_bucket(self, need: int) -> int:
        """The context a step reading `need` slots runs in: its bucket, or (no buckets) that many."""
        return self._context_bucket(need) if self.buckets else min(need, self.cap)

    def _width_bucket(self, width: int) -> int:
        return min(max(16, next_pow2(width)), self.max_len)

    def _prefill_forward(self, start: int, ids: torch.Tensor, lens: torch.Tensor, sampled: bool,
                         logprobs: bool = False) -> torch.Tensor:
        """Prompts ids [k, W] (right-padded, lengths lens [k]) into rows start..: the target's
        cache and features, the first token (returned), the drafter's cache. Device work only."""
        k, width = ids.shape
        rows = slice(start, start + k)
        out = self.target(ids, torch.arange(width, device=ids.device).expand(k, width), cache=self.cache.rows(rows),
                          kv_len=width, capture_layers=self.layer_ids,
                          logits_positions=(lens - 1)[:, None])
        first = sample_rows(out.logits, self.row_params.rows(rows), lens[:, None], sampled)[:, 0]
        if logprobs:
            self._write_logprobs(out.logits, first[:, None], rows, 1)
        self.committed[rows] = lens
        self.root[rows] = first
        if self.drafter is not None:
            self.drafter.prefill(PrefillBatch(start, ids, lens, first, out.aux_hidden, out.hidden))
        return first

    @staticmethod
    def _tokens(res: list[int]) -> list[int]:
        """A row's new tokens from its step result (a row of `out`): the accepted drafts, then the bonus."""
        return res[5: 4 + res[0]] + [res[1]]

    @staticmethod
    def _ends(row: _Row, tokens: list[int]) -> bool:
        """These tokens of a step would end the row (`_emit`): they reach its budget or hold a stop."""
        stops = row.request.stop_ids
        return len(tokens) >= row.budget - row.emitted or bool(stops) and not stops.isdisjoint(tokens)

    def _emit(self, row: _Row, tokens: list[int]) -> tuple[list[int], str | None]:
        stops = row.request.stop_ids
        if not self._ends(row, tokens):
            row.history += tokens  # (most steps: every token, no stop, the budget not reached)
            row.emitted += len(tokens)
            return tokens, None
        out = []
        for t in tokens:
            if t in stops:
                return out, "stop"
            out.append(t)
            row.history.append(t)
            row.emitted += 1
            if row.emitted >= row.budget:
                return out, "length"
        return out, None

    def _remove(self, indices: list[int]) -> None:
        """Finished rows leave: the last row moves into each freed row (its cache entries too,
        including what a step still in flight will have added)."""
        ahead = self.depth + 1 if self._inflight is not None else 0
        for i in sorted(indices, reverse=True):
            self.rows[i].finished = True
            if self.policy is not None:
                self.policy.release(self.rows[i].acceptance)
            last = len(self.rows) - 1
            if i != last:
                moving = self.rows[last]
                self._move_row(last, i, min(moving.committed + ahead, self.cap))
                self.rows[i] = moving
            self.rows.pop()
            self._clear_row(last)

    def _move_row(self, src: int, dst: int, length: int) -> None:
        """Row src's cache entries [:length] and state into row dst."""
        kv = self.cache.kv
        kv[:, :, dst, :, :length] = kv[:, :, src, :, :length]
        for block in self._row_blocks:  # (committed, root, limits, sampling parameters: `_allocate`)
            block[:, dst] = block[:, src]
        if self.drafter is not None:
            self.drafter.move_row(src, dst, length)

    def _clear_row(self, row: int) -> None:
        # an idle row inside a padded batch computes harmlessly on its own cache row
        # committed, root and the limits at once (`t[row] = 0` would wait for the step in flight: a
        # host scalar's copy)
        self._row_blocks[0][:4, row].fill_(0)
        if self.drafter is not None:
            self.drafter.clear_row(row)

    def _host_tree(self, n: int, b: int, tier: int, proposal: Tree | None = None) -> Tree:
        """The host drafter's tree for this tier into the step's inputs; `proposal`: the full tier's
        chain proposed already (a smaller chain tier verifies its first nodes: a chain's prefix)."""
        size = 1 + self._drafters[tier].num_draft
        tree = self._propose(self._drafters[tier]) if proposal is None else proposal.chain_prefix(size)
        t = self.tree_in
        for dst, src in ((t.tokens, tree.tokens), (t.parents, tree.parents), (t.depth, tree.depth),
                         (t.valid, tree.valid), (t.rank, tree.ranks())):
            dst[:n, :size].copy_(src)
        t.valid[n:b] = False  # padding rows: the root alone
        return tree

    def _propose(self, drafter) -> Tree:
        """A host drafter's tree for the active rows (checked for the size the engine was built for)."""
        n = len(self.rows)
        tree = drafter.propose(DraftContext(n, self.cap, self.root[:n],
                                            [r.history for r in self.rows] if drafter.needs.history else None))
        if tree.size != 1 + drafter.num_draft:
            raise EngineError(f"drafter proposed {tree.size - 1} nodes; the engine was built for {drafter.num_draft}")
        return tree

    # ------------------------------------------------------------------ the step
    def _run(self, b: int, kv: int, sampled: bool, tier: int, logprobs: bool = False) -> torch.Tensor:
        """Step rows [:b] verifying tier `tier`'s tree (0: the roots alone); the result rows (`out`)."""
        key = (b, kv, sampled, tier) + ((True,) if logprobs else ())
        if tier == 0 and self._drafted and self._keeps_up:  # (the plain graph of every bucket is the narrow one)
            key = (b, kv, sampled, tier, logprobs, self._gated_last or 1)
        elif tier and self._gated_last:  # (the variant that feeds a gated step's paths: `_fed`)
            key = (b, kv, sampled, tier, logprobs, self._gated_last)
        elif 0 < tier < self._full and self._narrow_last and self._narrows(b):  # (`_narrow_feed`)
            key = (b, kv, sampled, tier, logprobs, 4)
        if not self.use_graphs:
            with torch.no_grad():
                self._step(*key)
            return self.out
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        self.graphs[key].replay()
        return self.out

    def _capture(self, b: int, kv: int, sampled: bool, tier: int, logprobs: bool = False,
                 wide: int = 0) -> torch.cuda.CUDAGraph:
        graph, _ = capture_graph(lambda: self._step(b, kv, sampled, tier, logprobs, wide), self._pool,
                                 self._restorer(), self.capture_warmups)
        self._pool = graph.pool()
        return graph

    def _fed(self, wide: int) -> int:
        """The most entries a row can hold pending before a step (`DraftContext.feed`): a path of the
        gate's longer chain (ngram_gate_chain) after a gated step (`wide` 2: the step's graph is that
        variant, `_run`), else a path of the tree. A drafter feeds its pending entries at a fixed
        width: on an H200 at batch 64 the gated chain's 32 entries a row took an EAGLE-3 chain step
        from 1.91 to 2.12 ms (2026-12-04), and the full tree at batch 1 from 0.92 to 0.93 ms. In the
        gate's batches every step has both variants; a wider batch, where only rows that joined
        right after a gated step can follow one, feeds that step's paths in a plain step of its own
        (`_catch_up`). `wide` 3: after a gated step of the ladder's chain (ngram_gate_long); `wide` 4:
        a wide batch's smaller tier behind a plain step or a smaller tier's, the smaller tiers' paths
        (`_narrow_feed`)."""
        if wide == 4:
            return self._narrow_width
        if wide >= 2:
            return 1 + self._drafters[self._gated_long if wide == 3 else self._gated].num_draft
        return self.tree_nodes

    def _narrow_feed(self, tiers) -> int | None:
        """The feed width of a smaller tier's step (not the full tree's) behind a plain step or a
        smaller tier's, in batch buckets from NARROW_FEED_ROWS: the longest path those tiers can accept
        (1 + their depth, at most their draft count), where it is narrower than the full tree's and
        the drafter feeds its head at a fixed width (`HeadCacheRows.fed`, through the assist's inner
        drafter); else None. At chat batch 64 on an H100 the adaptive policy's chain-4 steps ran 0.35 ms
        apart more than a fixed chain 4's (2026-12-06), whose head is fed 5 entries a row where the
        adaptive engine's fed the full tree's 16. The full tree's step and a plain one keep the full
        width (rare in a wide batch: fewer graphs to capture at start)."""
        if len(tiers) < 2 or not self._keeps_up:
            return None
        inner = self.drafter
        while hasattr(inner, "inner"):
            inner = inner.inner
        if not hasattr(inner, "fed"):
            return None
        width = 1 + max(min(t.steps, t.num_draft) for t in tiers[:-1])
        return width if width < self.tree_nodes else None

    def _narrows(self, b: int) -> bool:
        """Batch bucket b has the narrow-feed variant of the smaller tiers' steps (`_narrow_feed`; a
        step takes it behind a plain step or a smaller tier's: `_narrow_last`, never after a gated one)."""
        return self._narrow_width is not None and b >= NARROW_FEED_ROWS

    def _reach(self, b: int) -> int:
        """The most drafts a step of batch bucket `b` can accept: the gate's longer chain in the gate's
        batches, else the tree's draft count."""
        if self._gated is not None and b <= self._gate_rows:
            return self.widest_nodes - 1
        return self.tree_nodes - 1

    def _catch_up(self, b: int) -> bool:
        """The last step was gated and new rows made the batch wider than the gate's: its rows' paths
        (up to the gated chain's) are fed in a plain step before the next drafting one (`_fed`)."""
        return self._gated_last and b > self._gate_rows

    def _tree(self, b: int, kv: int, tier: int, wide: int = 0) -> Tree:
        drafter = self._drafters[tier]
        if drafter is not None and not self._host_drafts:
            return drafter.propose(DraftContext(b, kv, self.root[:b], feed=self._fed(wide)))
        if drafter is not None:
            t, n = self.tree_in, 1 + drafter.num_draft
            return Tree(t.tokens[:b, :n], t.parents[:b, :n], t.depth[:b, :n], t.valid[:b, :n], drafter.depth,
                        t.rank[:b, :n])
        lone = self._lone
        return Tree(self.root[:b, None], lone.parents[:b], lone.depth[:b], lone.valid[:b], 0)

    def _step(self, b: int, kv: int, sampled: bool, tier: int, logprobs: bool = False, wide: int = 0) -> None:
        """Draft, verify, accept and commit for rows [:b] (tier 0: no drafts; `wide` 1: a plain step
        after a drafting one, 2: any step after a gated one, 3: after a ladder's, 4: a wide batch's smaller
        tier behind a smaller tier's, `_fed`); fixed shapes, no host syncs."""
        draft = tier > 0
        # a plain step of a device drafter keeps its row state up to date (the smallest tier takes
        # in what the last step left pending; the root's one-node path is committed below), so a
        # step that drafts after plain ones drafts from the whole context: before, the head's
        # state stood still through plain steps, and an EAGLE-3 head probing after them on the CPU
        # (SmolLM2, gpu_runs/probe_acceptance.py) had 0.92 drafts accepted a drafting step, 1.87 now
        # (after a plain step or a prefill each row has one entry pending: a narrow keep-up, which at
        # batch 64 on an H200 cost an EAGLE-3 engine's plain step 8% over `ar`'s at full width)
        keep = not draft and self._keeps_up
        first = None
        if keep:
            ctx = DraftContext(b, kv, self.root[:b], feed=self._fed(wide))
            self._drafters[1].keep_up(ctx, bool(wide))
            if self._tells_first(b):  # (before the commit moves the row state past the root)
                first = self._drafters[1].first_draft(ctx)
        tree = self._tree(b, kv, tier, wide)
        anc, y, out = self._verify(tree, b, kv, sampled)
        logits = out.logits
        # accept, then the rows' state and results (out) in one launch; base keeps where the
        # path's entries sit for the commit
        path, n_acc = finish_step(tree.tokens, tree.parents, tree.valid, tree.depth, anc, y, tree.max_depth,
                                  self.committed[:b], self.base[:b], self.root[:b], self.out[:b])
        if first is not None:  # the root now holds the target's token after the old root
            tokens, found = first
            self.out[:b, -1] = (found & (tokens == self.root[:b])).long()
        if draft or keep:
            self._drafters[max(tier, 1)].commit(StepResult(b, tree, path, n_acc, y, out.aux_hidden, out.hidden))
        if draft and self._gated is not None and b <= self._gate_rows:  # for the gate (`_gate`)
            self.out[:b, -1] = self.drafter.next_found(DraftContext(b, kv, self.root[:b])).long()
        if tree.max_depth:  # a lone root is in place
            commit_kv(self.cache.layers(slice(0, b)), self.base[:b], path, n_acc)
        if logprobs:  # the token emitted at path position j is y at path node j, drawn from its logits
            nodes = path.clamp(min=0)
            rows = logits.gather(1, nodes[..., None].expand(-1, -1, logits.shape[-1]))
            self._write_logprobs(rows, y.gather(1, nodes), slice(0, b), path.shape[1])

    def _write_logprobs(self, logits: torch.Tensor, tokens: torch.Tensor, rows: slice, width: int) -> None:
        """log_softmax of the target's raw logits [R, W, V] at the tokens [R, W] and the most likely
        MAX_TOP_LOGPROBS, into the step's buffers (rows, path positions :W)."""
        lsm = torch.log_softmax(logits.float(), dim=-1)
        chosen, top_val, top_idx = self.step_lp
        chosen[rows, :width] = lsm.gather(-1, tokens[..., None])[..., 0]
        top = lsm.topk(min(MAX_TOP_LOGPROBS, lsm.shape[-1]), dim=-1)
        top_val[rows, :width, : top.values.shape[-1]] = top.values
        top_idx[rows, :width, : top.indices.shape[-1]] = top.indices

    def _verify(self, tree: Tree, b: int, kv: int, sampled: bool):
        """The target over the tree (its validity under each row's limits set on `tree`):
        returns the ancestor matrix, the target's token at every node and its outputs."""
        tree.valid, anc, positions, slots = step_inputs(tree, self.committed[:b], self.depth_limit[:b],
                                                        self.draft_limit[:b])
        # node n at slot committed + n, attending as the plain decode of its path would (a lone
        # root sits at the slot of its position: the same sums, without the tree's lookups)
        keys = (self.committed[:b], anc, tree.depth) if tree.max_depth else None
        out = self.target(tree.tokens, positions, cache=self.cache, kv_len=kv, tree=keys, cache_slots=slots,
                          capture_layers=self.layer_ids)
        # the target's own token at every node (the token at sequence position `positions + 1`)
        y = sample_rows(out.logits, self.row_params.rows(slice(0, b)), positions + 1 if sampled else None, sampled)
        return anc, y, out


def pooled(results: list[GenerationResult]) -> dict:
    """Totals over results: output tokens, verify steps, accepted drafts, and the mean acceptance
    length pooled the engine's way (1 + accepted drafts / verify steps; None where no step ran)."""
    tokens = sum(len(r.token_ids) for r in results)
    steps = sum(r.steps for r in results)
    accepted = sum(r.accepted_tokens for r in results)
    return {"tokens": tokens, "steps": steps, "accepted_tokens": accepted,
            "mean_accept_length": 1.0 + accepted / steps if steps else None}


def accept_path(tree: Tree, anc: torch.Tensor, y: torch.Tensor):
    """The accepted path of each row (kernels.verify.accept): path [B, depth+1] (node indices,
    -1 after its end), its length [B], its last node [B] and the bonus token [B]."""
    return accept(tree.tokens, tree.parents, tree.valid, tree.depth, anc, y, tree.max_depth)


def decode(target, prompts: list[list[int]], params: SamplingParams, stop_ids=(), max_batch: int | None = None,
           max_len: int | None = None, progress=None) -> list[list[int]]:
    """Plain decoding (the target alone) of many prompts on the engine, the stop token left
    out: what regeneration runs, and the reference speculative decoding must equal."""
    if not prompts:
        return []
    max_len = max_len or min(max(len(p) for p in prompts) + params.max_new_tokens, target.rotary.max_positions)
    engine = SpecEngine(target, method="ar", max_len=max_len, max_batch=max_batch or len(prompts))
    return [r.token_ids for r in engine.generate(prompts, params, stop_ids, progress)]

