"""The speculation policy: which draft tree each step verifies (a tier), or none.

An engine builds its drafter for the largest tree it may verify (the server's maximum). With the
adaptive policy it also holds one drafter per smaller tier, sharing the weights and the per-row
state (`Drafter.tier`), each with its own step graphs. Before each step the policy picks one tier
for the whole batch, or none (a plain decode step: every row verifies only its next token). A tier
never changes an output: verification is lossless, so greedy output is the target's own and sampled
output follows the request's counter-based noise whatever tree was verified.

The choice: the most expected tokens per unit of cost,

    tokens per second of tier t = sum over rows r of E_r(t) / cost(batch, context, t)
    E_r(t) = 1 + sum over depths d <= depth(t) of prod over j <= d of q_r,t(j)

q_r,t(j) is row r's acceptance at depth j when its step reached depth j - 1 under tier t: an average
over its last `window` such steps, shrunk (where the row has few) toward all rows' acceptance under
tier t times row r's ease (its accepted drafts at depth j over what all rows' records of the tiers it
ran predict); all rows' record of tier t (over `pooled_window` steps) is shrunk toward every tier's,
and that toward the depth above (depth 1: `prior`, weighted `prior_weight`). A tier a request has not
run is so judged by that tier's record scaled by how the request fares, and a depth no step reached
yet accepts as the one above it. A row that drafts nothing (its request turned speculation off)
counts one token; a request's own depth cap (SpecControl.num_steps) cuts its sum short; a depth a
tier offered but the drafter left empty counts as rejected. A host drafter of chains (`ngram-host`)
proposes before the choice where no step is in flight: a row it has nothing for counts one token and
a shorter chain caps the row there; planned behind a step in flight, a row's drafts count at its
share of steps with a proposal. A smaller tier replaces the full tree only where it promises
`switch_margin` more: its estimate's error costs more than it gains where the rates are close.

Within a step the draft sets its own depth too: under this policy an EAGLE-3 head's draft stops after
the first depth where no row's best node keeps a probability of `draft_stop` (the drafter's option,
DRAFT_STOP by default; drafters/eagle.py), decided on the card inside the captured step. The depths
it did not draft count as offered and rejected in the records (the acceptance a tier gets with the
stop is what the choice should expect of it).

Keeping the records fresh. A tier that is not chosen is not observed, and a plain step observes
nothing, so a record taken early (a stream's first steps accept least) could decide for hundreds of
steps. Hence:
- probes: after `probe_every` plain steps in a row the best tier runs once; a probe that leaves
  plain decoding the choice doubles the run before the next one, up to `probe_backoff` times
  `probe_every`; a step that drafts on its merits resets it. A probe's observation is folded into
  the records at once.
- `share_chains` 1: a chain's step updates every chain tier's record (a chain drafts the same top-1
  token at each depth whatever its length).
- `full_share` s: where a smaller tier is chosen, the full tree runs once its drafting steps since
  it last ran, times s, reach what its step costs over the chosen tier's (at most about that share
  of the time goes to it). `share_all` 1 (the default) applies the rule to every tier dearer than
  the chosen one, so a middle tier judged on a stream's first steps is seen again (0: the full tree
  alone); `share_all` 2, in a batch of more than SHARE_ALL_ROWS rows, to every other tier, priced by
  the tokens/s its step would give up (narrower batches keep rule 1).
- `explore_every` n > 0: a tier idle for n drafting steps runs instead of the best one.
- `bound_trees` 1: a tree tier's estimate at each depth is at least the chains' (its top-k holds
  their top-1 token).
- first drafts: where the drafter tells its first draft in a plain step (`Abilities.first_draft`:
  the device n-gram's lookup), a batch of at most FIRST_DRAFT_ROWS rows checks each row's first
  draft against the target's token in every plain step (`observe_first`): a trial at depth 1 of
  every chain tier, so a request whose drafts match again drafts at once.

The policy's host time. In a batch of more than FRESH_ROWS rows, observations are summed per row and
folded into the records every `refresh` observations (every row's expected tokens are worked out
again after a fold, at once for a new row or a changed depth cap); between folds a choice in the
same buckets is answered from the last estimate. In a batch of more than BACKOFF_ROWS rows, where a
fold's estimate picks the tier the one before it picked, the interval to the next fold doubles, up to
`refresh_max` observations; a new pick, a new batch bucket or a probe brings it back to `refresh` (a
new bucket folds what is pending first). A full batch holding one tier so spends little host time on
estimates that change nothing (gpu_runs/policy_host.py at batch 64: 0.106 -> 0.033 ms a step on this
project's CPU, the same choices). A narrower batch folds each observation at once.
There, with `hold` h, a choice that leads the one nearest to replacing it by the share L is repeated
for the next L / h choices (at most HOLD_STEPS) for the same rows and buckets without an estimate.

A batch that drains (`generate()` has admitted its last prompt) ends with its slowest rows: with
`drain` 1 tiers are ranked there by the `drain_quantile` quantile of the rows' expected tokens
instead of their sum. A server's batch never drains.

Costs, per (batch bucket, context bucket, tier), each step priced at the context bucket it would
read (the rows' context, the step in flight, its own tree's nodes: a plain step or a short chain may
fit a smaller bucket than the full tree, and runs there):
- measured (`SpeculationProfile`): the time of each tier's captured step graph (draft, verify,
  accept and commit, timed together as they replay) and of the plain step, on the card when the
  engine captures its graphs (`SpecEngine.capture_common` at a server's start) or loaded from a
  saved profile (JSON). Each bucket is timed with every row at its longest context and at its
  shortest (`context_ms`), and a step is priced on the line through them at its rows' mean context
  (attention reads each row's own keys). A bucket without times takes the nearest timed one's and
  is timed, and added to the profile, when the engine is next idle; a tier the profile lacks is
  timed at the first bucket a step plans. A host drafter's steps also pay the proposal and the
  host's bookkeeping, measured as they run.
- paced (`pace` 1): a step costs at least the time the engine measured between two steps' results
  of the same tier and batch bucket (`paced`, once PACE_MIN_STEPS were read), where the host, not
  the card, sets the pace.
- static (`StaticCost`, where nothing is timed: CPU, no CUDA graphs): in units of a plain decode
  step, verifying T tokens costs max(1, T / saturation_tokens), and each draft depth
  draft_depth_cost x max(1, rows x topk / saturation_tokens). No context term.

Every default was chosen on the replay of the validation split's traces with a card's measured
costs (`evaluation/policy_sim.py`) and checked on the card; the runs behind each are in
docs/history/2026-12-04-policy-defaults-evidence.md and docs/benchmarks.md, "Speculation policy".
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specheads.runtime.defaults import tree_pool

POLICIES = ("fixed", "adaptive")
PROFILE_FORMAT = "specheads-speculation-profile/1"
PLAIN_KEY = "plain"
FRESH_ROWS = 8  # up to this many rows, each observation is folded into the records at once
FIRST_DRAFT_ROWS = 8  # up to this many rows (the batch bucket), plain steps tell their first drafts
PACE_WEIGHT = 0.05  # a step's share of its tier's paced time (AdaptivePolicy.paced)
PACE_MIN_STEPS = 8  # steps of a tier and batch bucket read before their pace counts
HOLD_STEPS = 16  # the most choices a clear one is repeated without an estimate (AdaptivePolicy, hold)
SHARE_ALL_ROWS = 2 * FRESH_ROWS  # share_all 2 prices refreshes by tokens/s in batches wider than this
BACKOFF_ROWS = 2 * FRESH_ROWS  # the folds' interval may grow past `refresh` in batches wider than this


def _kv_key(kv):
    """A step's context bucket(s) as a cache key: one bucket, or one per option (a list or array)."""
    return tuple(kv) if np.ndim(kv) else kv


class PolicyError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class TreeShape:
    """A draft tree's size: depth (num_steps), branching (topk; 1 = a chain) and draft tokens."""

    steps: int
    topk: int
    num_draft: int

    def __str__(self) -> str:
        return self.label

    @functools.cached_property
    def label(self) -> str:
        """'S,K,N' (asked per request and step by generate(): made once)."""
        return f"{self.steps},{self.topk},{self.num_draft}"

    @property
    def pool(self) -> int:
        """The candidates a dynamic tree of this depth and branching chooses its nodes from."""
        return tree_pool(self.steps, self.topk)


TIERS_HELP = "tiers as STEPS,TOPK,DRAFT_TOKENS separated by ';', e.g. \"1,1,1;2,1,2;4,1,4;6,4,15\""


def parse_tiers(spec, what: str = "--speculation-tiers") -> list[TreeShape]:
    """'S,K,N;S,K,N;...' or a list of (S, K, N) / TreeShape -> tree shapes (checked for form only)."""
    if isinstance(spec, str):
        parts = [p for p in spec.replace(" ", "").split(";") if p]
        if not parts:
            raise PolicyError(f"{what} {spec!r} names no tier; expected {TIERS_HELP}")
        items = []
        for p in parts:
            try:
                items.append(tuple(int(x) for x in p.split(",")))
            except ValueError:
                raise PolicyError(f"{what}: tier {p!r} is not three integers; expected {TIERS_HELP}") from None
    else:
        items = [tuple(t) if not isinstance(t, TreeShape) else (t.steps, t.topk, t.num_draft) for t in spec]
    shapes = []
    for t in items:
        if len(t) != 3 or any(x < 1 for x in t):
            raise PolicyError(f"{what}: tier {','.join(map(str, t))} must be three integers >= 1 "
                              f"(steps, topk, draft tokens); expected {TIERS_HELP}")
        shapes.append(TreeShape(*t))
    return shapes


def check_tier(shape: TreeShape, full: TreeShape, trees: bool, what: str = "--speculation-tiers") -> TreeShape:
    """A tier must fit inside the engine's tree (its maximum), and be a tree its drafter can draft."""
    if not trees and shape.topk != 1:
        raise PolicyError(f"{what}: tier {shape}: this drafter drafts chains only, so topk must be 1")
    if shape.steps > full.steps or shape.topk > full.topk or shape.num_draft > full.num_draft:
        raise PolicyError(f"{what}: tier {shape} is larger than this engine's tree {full} (--num-steps {full.steps} "
                          f"--topk {full.topk} --num-draft-tokens {full.num_draft}), the maximum: its steps, topk "
                          f"and draft tokens must each be at most that tree's")
    if shape.topk == 1 and shape.num_draft != shape.steps:
        raise PolicyError(f"{what}: tier {shape} is a chain (topk 1) of {shape.steps} steps, so it drafts "
                          f"{shape.steps} tokens: write {shape.steps},1,{shape.steps}")
    if shape.num_draft > shape.pool:
        raise PolicyError(f"{what}: tier {shape}: a tree {shape.steps} deep with topk {shape.topk} has "
                          f"{shape.pool} candidates, fewer than {shape.num_draft} draft tokens")
    return shape


def default_tiers(full: TreeShape) -> list[TreeShape]:
    """Chains 1, 2 and 4 deep (below the full depth), then the full tree: a chain verifies few
    tokens per row, what large batches can afford; the full tree is what pays at batch 1."""
    tiers = [TreeShape(d, 1, d) for d in (1, 2, 4) if d < full.steps]
    return sorted(set(tiers + [full]), key=lambda t: (t.num_draft, t.steps, t.topk))


def resolve_tiers(tiers, full: TreeShape, trees: bool, can_tier: bool) -> list[TreeShape]:
    """The tiers an adaptive engine verifies, smallest first, the full tree always last: the
    given ones (checked) or the defaults; a drafter that cannot draft smaller trees has only its own."""
    if tiers is None:
        return default_tiers(full) if can_tier else [full]
    shapes = [check_tier(t, full, trees) for t in parse_tiers(tiers)]
    if not can_tier and set(shapes) != {full}:
        raise PolicyError(f"--speculation-tiers: this drafter drafts one tree only ({full}); an adaptive policy "
                          f"chooses between it and plain decoding (leave the tiers out)")
    return sorted(set(shapes) | {full}, key=lambda t: (t.num_draft, t.steps, t.topk))


# ---------------------------------------------------------------------------- costs
def context_hint(mean: float, kv: int) -> int:
    """The rows' mean context before a step, rounded up to a sixteenth of its bucket kv: where the
    policy prices the step (`SpeculationProfile.step`); a rounded value keeps its answers cached
    for stretches of steps."""
    q = max(kv // 16, 1)
    return int(-(-mean // q)) * q


@dataclass
class StaticCost:
    """Step costs in units of a plain decode step where nothing is timed (module docstring)."""

    saturation_tokens: int = 128
    draft_depth_cost: float = 0.1
    measured = False

    def step(self, batch: int, kv: int, tier: TreeShape | None, context: int | None = None) -> float:
        if tier is None:
            return max(1.0, batch / self.saturation_tokens)
        verify = max(1.0, batch * (1 + tier.num_draft) / self.saturation_tokens)
        return verify + self.draft_depth_cost * tier.steps * max(1.0, batch * tier.topk / self.saturation_tokens)


@dataclass
class SpeculationProfile:
    """Measured step times (ms) per tier ("plain" or "S,K,N"), batch bucket and context bucket,
    for one card, target shape and drafter (`fingerprint`); saved and loaded as JSON."""

    device: str
    fingerprint: dict
    step_ms: dict = field(default_factory=dict)  # key -> {batch: {kv: ms}}: every row at the bucket's top
    # key -> {batch: {kv: {fill: ms}}}: the same step with every row holding `fill` tokens (`add_point`)
    context_ms: dict = field(default_factory=dict)
    measured = True

    @staticmethod
    def key(tier: TreeShape | None) -> str:
        return PLAIN_KEY if tier is None else str(tier)

    version = 0  # bumped by add: a policy's cached step costs are worked out again

    def add(self, tier: TreeShape | None, batch: int, kv: int, ms: float) -> None:
        self.step_ms.setdefault(self.key(tier), {}).setdefault(int(batch), {})[int(kv)] = float(ms)
        self.version += 1

    def add_point(self, tier: TreeShape | None, batch: int, kv: int, fill: int, ms: float) -> None:
        """The step's time in this bucket with every row holding `fill` tokens: `step` interpolates
        between a bucket's points by the context it is asked for."""
        self.context_ms.setdefault(self.key(tier), {}).setdefault(int(batch), {}).setdefault(int(kv), {})[
            int(fill)] = float(ms)
        self.version += 1

    def points(self, tier: TreeShape | None, batch: int, kv: int) -> dict:
        """{fill: ms} timed in this bucket (`add_point`; empty where none were)."""
        return self.context_ms.get(self.key(tier), {}).get(batch, {}).get(kv, {})

    def has(self, batch: int, kv: int, tiers) -> bool:
        return all(kv in self.step_ms.get(self.key(t), {}).get(batch, {}) for t in [None, *tiers])

    def has_any(self, tiers) -> bool:
        """Some bucket timed for plain decoding and each tier: `step` can price every bucket."""
        return all(self.key(t) in self.step_ms for t in [None, *tiers])

    def step(self, batch: int, kv: int, tier: TreeShape | None, context: int | None = None) -> float:
        """The measured time of the nearest bucket (log scale) where this one was not timed; with
        `context` (the rows' mean tokens before the step) and two or more points timed in that
        bucket, the line through the points around it: the top point's time past the top, and
        below the lowest point the line of the two lowest carried down (to no context at least),
        where they lie a quarter of the bucket apart or more and the line rises; else the lowest
        point's time."""
        table = self.step_ms[self.key(tier)]
        b = min(table, key=lambda x: (abs(math.log2(x) - math.log2(batch)), -x))
        row = table[b]
        k = min(row, key=lambda x: (abs(math.log2(x) - math.log2(kv)), -x))
        points = self.points(tier, b, k) if context is not None else None
        if not points or len(points) < 2:
            return row[k]
        fills = sorted(points)
        if context >= fills[-1]:
            return points[fills[-1]]
        if context <= fills[0]:
            lo, hi = fills[0], fills[1]
            if hi - lo < k / 4 or points[hi] <= points[lo]:
                return points[lo]
            context = max(context, 0)
        else:
            hi = next(f for f in fills if f >= context)
            lo = fills[fills.index(hi) - 1]
        return points[lo] + (points[hi] - points[lo]) * (context - lo) / (hi - lo)

    def to_json(self) -> dict:
        out = {"format": PROFILE_FORMAT, "device": self.device, "fingerprint": self.fingerprint,
               "step_ms": {key: {str(b): {str(k): ms for k, ms in sorted(row.items())}
                                 for b, row in sorted(table.items())} for key, table in self.step_ms.items()}}
        if self.context_ms:
            out["context_ms"] = {key: {str(b): {str(k): {str(f): ms for f, ms in sorted(points.items())}
                                                for k, points in sorted(row.items())}
                                       for b, row in sorted(table.items())} for key, table in self.context_ms.items()}
        return out

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path) -> "SpeculationProfile":
        path = Path(path)
        where = f"speculation profile {str(path)!r}"
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise PolicyError(f"{where} is not JSON ({e}); write it with --speculation-profile on a new path "
                              f"(the measured profile is saved there)") from None
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise PolicyError(f"{where} has format {got!r}; expected {PROFILE_FORMAT!r} (a file written by "
                              f"specheads with --speculation-profile)")
        missing = [k for k in ("device", "fingerprint", "step_ms") if k not in data]
        if missing:
            raise PolicyError(f"{where} lacks {', '.join(missing)}; expected the fields device, fingerprint, step_ms")
        profile = cls(str(data["device"]), data["fingerprint"])
        try:
            for key, table in data["step_ms"].items():
                if key != PLAIN_KEY:
                    parse_tiers(key, f"{where}: step_ms key")
                for b, row in table.items():
                    for k, ms in row.items():
                        ms = float(ms)
                        if not (math.isfinite(ms) and ms > 0) or int(b) < 1 or int(k) < 1:
                            raise ValueError(f"{key} batch {b} context {k}: {ms}")
                        profile.add(None if key == PLAIN_KEY else parse_tiers(key)[0], int(b), int(k), ms)
            for key, table in data.get("context_ms", {}).items():  # (profiles written before it lack it)
                for b, row in table.items():
                    for k, points in row.items():
                        for f, ms in points.items():
                            ms = float(ms)
                            if not (math.isfinite(ms) and ms > 0) or int(b) < 1 or int(k) < 1 or int(f) < 0:
                                raise ValueError(f"context_ms: {key} batch {b} context {k} fill {f}: {ms}")
                            profile.add_point(None if key == PLAIN_KEY else parse_tiers(key)[0], int(b), int(k),
                                              int(f), ms)
        except (AttributeError, TypeError, ValueError) as e:
            if isinstance(e, PolicyError):
                raise
            raise PolicyError(f"{where}: step_ms must map \"plain\" or \"S,K,N\" to {{batch: {{context: ms > 0}}}} "
                              f"and context_ms (optional) to {{batch: {{context: {{tokens: ms > 0}}}}}} ({e})") from None
        return profile

    def check(self, path, device: str, fingerprint: dict, tiers, can_time: bool = False) -> "SpeculationProfile":
        """Refuse a profile of another card, model or drafter, or one missing a tier where the engine
        cannot time steps (`can_time`: it captures step graphs; the missing tiers are then timed
        with every tier at the first bucket a step plans, and the profile saved with them)."""
        where = f"speculation profile {str(path)!r}"
        if self.device != device:
            raise PolicyError(f"{where} was measured on {self.device!r}, not this {device!r}: pass a new path to "
                              f"measure this card (the profile is saved there)")
        if self.fingerprint != fingerprint:
            diff = sorted(k for k in set(self.fingerprint) | set(fingerprint)
                          if self.fingerprint.get(k) != fingerprint.get(k))
            raise PolicyError(f"{where} belongs to another model or drafter ({', '.join(diff)}: "
                              f"{[self.fingerprint.get(k) for k in diff]} there, {[fingerprint.get(k) for k in diff]} "
                              f"here): pass a new path to measure this one")
        lacking = [self.key(t) for t in [None, *tiers] if self.key(t) not in self.step_ms]
        if lacking and not can_time:
            held = "; ".join(k for k in self.step_ms if k != PLAIN_KEY)
            raise PolicyError(f"{where} has no times for {', '.join(lacking)} (it holds plain and {held or 'no tier'}): "
                              f"pass --speculation-tiers among those, or run on the GPU (which times them and "
                              f"adds them to the profile)")
        return self


# ---------------------------------------------------------------------------- acceptance
def _running_mean(mean: np.ndarray, count: np.ndarray, trials: np.ndarray, hits: np.ndarray, window: int) -> None:
    """Fold `trials` more observations with `hits` successes into running means (in place): the
    exact mean until `window` observations, then each new batch weighs trials / window (a whole
    window's worth or more replaces the mean)."""
    seen = np.minimum(count + trials, window)
    # where trials is 0 the weight is 0 and the mean stays (the floor of 1 only keeps 0 / 0 out);
    # where it is not, these are the plain quotients. Fewer array ops than masked divides: this
    # runs every step of a small batch, on the host's critical path
    once = np.maximum(trials, 1.0)
    mean += trials / np.maximum(seen, once) * (hits / once - mean)
    count[...] = seen


def _shrink(mean, count, toward, weight: float):
    return (mean * count + toward * weight) / (count + weight)


class FixedPolicy:
    """The engine's own tree at every step where a row drafts.

    A policy's interface (the engine's side): `tiers` (tree shapes, smallest first, the engine's
    full tree last), `cost`, `new_row()` (a row's acceptance record) and `release(record)` when
    the row leaves, `observe(records, tier, offered, accepted)` after each step of that tier (per
    drafting row: depths offered, drafts accepted), `observe_first(records, hits)` after a plain
    step whose drafter told its first drafts (per row that had one: 1 where the target's token
    equals it), `choose(rows, batch, kv, host_ms, draining, context)` -> the tier of the next step
    (0: plain decoding; i: tiers[i - 1]), `launched(tier)`, and `prime(records, caps)` while joining
    rows' prompts are prefilled (work the next choice would do, done while the card is busy)."""

    name = "fixed"

    def __init__(self, full: TreeShape):
        self.tiers = [full]
        self.cost = None

    def new_row(self):
        return None

    def release(self, row) -> None:
        pass

    def observe(self, rows: list, tier: int, offered: list[int], accepted: list[int]) -> None:
        pass

    def observe_first(self, rows: list, hits: list[int]) -> None:
        pass

    def paced(self, tier: int, batch: int, ms: float) -> None:
        pass

    def choose(self, rows: list, batch: int, kv, host_ms: float = 0.0, draining: bool = False,
               context: int | None = None) -> int:
        return 1

    def launched(self, tier: int) -> None:
        pass

    def prime(self, rows: list, caps: list[int]) -> None:
        pass


class AdaptivePolicy:
    """Picks each step's tier (1..len(tiers); 0: plain decoding) for the most expected tokens per
    unit of cost (module docstring). A row's record is a slot of the policy's arrays (mean and
    observation count per tier and depth); rows: per active row,
    (its slot, its depth cap), or None for a row that does not draft."""

    name = "adaptive"

    def __init__(self, tiers: list[TreeShape], cost, window: int = 32, prior: float = 0.7,
                 prior_weight: float = 8.0, pooled_window: int = 64, probe_every: int = 32, explore_every: int = 0,
                 switch_margin: float = 0.08, probe_backoff: int = 8, share_chains: int = 1,
                 bound_trees: int = 0, refresh: int = 4, drain: int = 0, drain_quantile: float = 0.05,
                 pace: int = 0, full_share: float = 0.01, hold: float = 0.05, share_all: int = 1,
                 refresh_max: int = 32):
        if not tiers:
            raise PolicyError("an adaptive policy needs at least one tier")
        self.tiers = list(tiers)
        self.cost = cost
        self.probe_every = probe_every
        self.pace = pace  # 1: a tier costs at least its steps' measured pace (`paced`); 0: its graph's time
        self.probe_backoff = probe_backoff  # the longest run between probes, in probe_every's (1: no backoff)
        self.probe_interval = probe_every  # plain steps in a row before the next probe
        self.probing = False  # the last choice was a probe (doubles the interval once launched)
        self._probed = False  # a probe was launched: its observation is folded at once (module docstring)
        self.plain_run = 0  # plain steps launched in a row while rows wanted drafts
        self.explore_every = explore_every  # 0: never
        # at most about this share of the time goes to full-tree steps run where a smaller tier is
        # chosen, so that the full tree's record follows the requests that run now (0: never;
        # module docstring, "full_share")
        self.full_share = full_share
        # which tiers full_share refreshes: 0 the full tree, 1 every dearer tier, 2 in a batch of more than
        # 2 x FRESH_ROWS rows every other tier by the tokens/s its step would give up (module docstring)
        self.share_all = share_all
        # a smaller tier than the full tree must promise this much more (a share) to run instead
        self.switch_margin = switch_margin
        self.idle = np.full(len(tiers), explore_every, dtype=np.int64)  # steps since each tier last ran
        self.window, self.pooled_window = window, pooled_window
        self.prior, self.prior_weight = prior, prior_weight
        self.depth = max(t.steps for t in self.tiers)
        n, d = len(self.tiers), self.depth
        self.mean, self.count = np.zeros((0, n, d)), np.zeros((0, n, d))  # per row slot
        self._free: list[int] = []
        self.tier_mean, self.tier_count = np.zeros((n, d)), np.zeros((n, d))  # every row, per tier
        self.all_mean, self.all_count = np.zeros(d), np.zeros(d)  # every row, every tier
        self._reach = np.array([[j < t.steps for j in range(d)] for t in self.tiers])  # [T, D]
        # the tiers whose records a step of each tier updates: itself, and with share_chains=1 for a
        # chain (topk 1) every other chain, since a chain drafts the same top-1 token at each depth
        # whatever its length (a chain tier that one unlucky step made look poor is still judged by
        # the chains that run)
        self._chains = [i for i, t in enumerate(self.tiers) if t.topk == 1]
        self._trees = [i for i, t in enumerate(self.tiers) if t.topk > 1]
        self._shares = [self._chains if share_chains and i in self._chains else [i] for i in range(n)]
        self._group = np.array([shares[0] for shares in self._shares])  # each tier's record: its first sharer's
        # bound_trees=1: a tree tier's estimate at each depth is at least the chains' (its top-k holds
        # their top-1 token), so a tree judged on a poor stretch recovers as the chains that run instead
        # do (module docstring)
        self._bound = bool(bound_trees and self._chains and self._trees)
        # each slot's expected tokens per tier [T] as last worked out, for its depth cap then and
        # the records' version (a fold changes every row's estimate through the pooled records): the
        # many plain steps between folds choose from these. In a batch of more than FRESH_ROWS rows
        # a fold comes every `refresh` observations (module docstring)
        self.refresh = refresh
        # the folds' interval in a wide batch now: `refresh`, doubled after each estimate that repeats
        # the pick before it, up to refresh_max (module docstring); the batch bucket and the pick it
        # was last worked out for
        self.refresh_max = max(refresh_max, refresh)
        self._interval, self._wide_bucket, self._wide_pick, self._wide_version = refresh, None, None, -1
        # drain 1: a draining batch ranks tiers by the drain_quantile quantile of its rows' expected
        # tokens (module docstring)
        self.drain, self.drain_quantile = bool(drain), drain_quantile
        self.version = 0  # the records' version: one more at each fold
        # the time between consecutive steps' results as the engine read them (ms, an average per
        # tier index and batch bucket; `paced`): a step costs at least that where the host, not the
        # card, sets the pace (module docstring). Taken into the costs at the next fold
        self._pace: dict = {}  # (tier index, batch bucket) -> [average ms, steps seen, least ms seen]
        self._pace_version, self._pace_dirty = 0, False
        self._tier, self._tier_version = None, -1
        self._costs: dict = {}  # (batch, context buckets, the cost's version) -> step costs [1 + T]
        self._tokens, self._tokens_cap, self._tokens_version = np.zeros((0, n)), np.zeros(0, int), np.zeros(0, int)
        # observations not yet folded into the records (a batch wider than FRESH_ROWS): trials and
        # hits per slot, tier and depth, and per tier and depth over every row
        self._pend_trials, self._pend_hits = np.zeros((0, n, d)), np.zeros((0, n, d))
        self._pend_k, self._pend_h = np.zeros((n, d)), np.zeros((n, d))
        self._pend_all_k, self._pend_all_h = np.zeros(d), np.zeros(d)
        self._pending = 0  # observations summed since the last fold
        self._pend_depth = 0  # the depths their trials and hits cover (a `_span`: a fold updates that many)
        self._pending_slots: list[np.ndarray] = []  # the slots each of them observed
        # [offered, accepted, depth]: a depth is a trial where its parent was reached (depth <=
        # accepted + 1) and it was offered, a hit where it was accepted
        o, a, j = np.ogrid[:d + 1, :d + 1, :d]
        self._trials = ((j <= a) & (j < o)).astype(float)
        self._hits = self._trials * (j < a)
        self._last_rates = None  # (its key, the rates): asked again between folds with the same rows and buckets
        # hold h (0: off): in a batch of at most FRESH_ROWS rows, a choice that leads every other by
        # the share L (`_lead`) is repeated for the next L / h choices (at most HOLD_STEPS) for the same
        # rows in the same buckets without an estimate; the observations meanwhile are kept and folded
        # at the next estimate (module docstring, "hold")
        self.hold = hold
        # (key, tier, merit, the pending observations that end it) of the held choice; choices left
        self._held, self._hold_left = None, 0
        self._deferred = False  # observations wait for the next estimate (a choice was held)
        self._raw: list = []  # observe's (slots, tier index, offered, accepted) not yet summed (`_sum_noted`)

    def new_row(self) -> int:
        if not self._free:  # twice the slots
            old = len(self.mean)
            grow = max(old, 8)
            self.mean = np.concatenate([self.mean, np.zeros((grow,) + self.mean.shape[1:])])
            self.count = np.concatenate([self.count, np.zeros((grow,) + self.count.shape[1:])])
            self._tokens = np.concatenate([self._tokens, np.zeros((grow, len(self.tiers)))])
            self._tokens_cap = np.concatenate([self._tokens_cap, np.zeros(grow, int)])
            self._tokens_version = np.concatenate([self._tokens_version, np.full(grow, -1)])
            self._pend_trials = np.concatenate([self._pend_trials, np.zeros((grow,) + self.mean.shape[1:])])
            self._pend_hits = np.concatenate([self._pend_hits, np.zeros((grow,) + self.mean.shape[1:])])
            self._free = list(range(old + grow - 1, old - 1, -1))
        slot = self._free.pop()
        if self._raw:  # (the slot's last row may have observations noted: summed before the slot is cleared)
            self._sum_noted()
        self.mean[slot] = 0
        self.count[slot] = 0
        self._pend_trials[slot] = 0
        self._pend_hits[slot] = 0
        self._tokens_version[slot] = -1
        if self._last_rates is not None and self._last_rates[0][-1] is not None:
            self._last_rates = None  # (a narrow batch's key names its slots: one may come back with a new record)
        # a held choice ends: it was for the rows before, and a slot that comes back would let the
        # hold's key (which names the slots) match a new request's rows (at batch 1, every request's)
        self._hold_left = 0
        return slot

    def release(self, row: int) -> None:
        self._free.append(row)

    def observe(self, rows: list[int], tier: int, offered: list[int], accepted: list[int]) -> None:
        """A step of tier (1-based): per drafting row (its slot), the depths it offered (the
        tier's depth, or less under the request's cap) and the drafts it accepted."""
        if tier < 1 or not rows:
            return
        self._raw.append((rows, tier - 1, offered, accepted))  # (noted now, summed at the next fold)
        self._observed(len(rows))

    def observe_first(self, rows: list[int], hits: list[int]) -> None:
        """A plain step where each of these rows' drafter told its first draft (module docstring):
        hits[i] 1 where the target's token equals it. A trial at depth 1 of every chain tier (a
        chain's first draft is the same whatever its length); a tree's top-k is not judged by it."""
        if not rows or not self._chains:
            return
        trials = np.zeros((len(rows), self._span(1)))
        trials[:, 0] = 1.0
        found = np.zeros_like(trials)
        found[:, 0] = hits
        self._add(np.asarray(rows), self._chains, trials, found)

    def _add(self, slots: np.ndarray, tiers: list[int], trials: np.ndarray, hits: np.ndarray) -> None:
        """One step's trials and hits [R, W] (the first W <= D depths) of these (distinct) slots,
        summed into the records of `tiers` not yet folded and into every tier's pooled one; folded
        now where due."""
        self._pend(slots, tiers, trials, hits)
        self._observed(len(slots))

    def _pend(self, slots: np.ndarray, tiers: list[int], trials: np.ndarray, hits: np.ndarray) -> None:
        """Trials and hits [R, W] of these (distinct) slots at the first W <= D depths (none deeper)
        into the pending records of `tiers` and every tier's pooled one."""
        k, h = trials.sum(0), hits.sum(0)
        w = len(k)
        self._pend_depth = max(self._pend_depth, w)  # (a fold updates the records that far)
        cut = self._cut(w)
        if len(tiers) == 1:  # (a step's own tier: a plain fancy add, 2 us where np.ix_ takes 5)
            t = tiers[0]
            self._pend_trials[slots, t, cut] += trials
            self._pend_hits[slots, t, cut] += hits
            self._pend_k[t, cut] += k
            self._pend_h[t, cut] += h
        else:  # (distinct slots and tiers, e.g. every chain's depth 1 from a first draft: one add each)
            at = np.ix_(slots, tiers, np.arange(w))
            self._pend_trials[at] += trials[:, None, :]
            self._pend_hits[at] += hits[:, None, :]
            self._pend_k[tiers, cut] += k
            self._pend_h[tiers, cut] += h
        self._pend_all_k[cut] += k
        self._pend_all_h[cut] += h
        self._pending_slots.append(slots)

    def _observed(self, rows: int) -> None:
        """One more observation of `rows` rows: folded now where due (a batch of at most FRESH_ROWS
        rows: at once; a wider one: every `refresh`), or, while a choice is held, at the next estimate."""
        self._pending += 1
        if self._hold_left:
            self._deferred = True
        elif rows <= FRESH_ROWS or self._pending >= self._interval or self._probed:
            self.fold()

    def _sum_noted(self) -> None:
        """The observations `observe` noted since the last fold, summed into the pending records at
        once (a slot and tier may come more than once), each into the records of every tier that
        shares its tier's (`share_chains`) and once into every tier's pooled one."""
        raw, self._raw = self._raw, []
        first = raw[0]
        if len(raw) == 1:
            offered, accepted = first[2], first[3]
        else:
            offered = [o for entry in raw for o in entry[2]]
            accepted = [a for entry in raw for a in entry[3]]
        # [N, D'], D' the depths up to the deepest offered (no trial past it: `_span`)
        d = self._span(max(offered))
        cut = self._cut(d)
        trials, hits = self._trials[offered, accepted, cut], self._hits[offered, accepted, cut]
        if all(entry[0] == first[0] and entry[1] == first[1] for entry in raw):
            # the same rows under one tier at every step (a batch that kept its rows and tier): [E, R, D']
            # summed over the steps, then one plain fancy add
            if len(raw) > 1:
                shape = (len(raw), len(first[0]), d)
                trials, hits = trials.reshape(shape).sum(0), hits.reshape(shape).sum(0)
            self._pend(np.asarray(first[0]), self._shares[first[1]], trials, hits)
        else:  # per (slot, record) and per record by sums over a flat index
            k = trials.sum(0)
            self._pend_depth = max(self._pend_depth, d)
            self._pend_all_k[:d] += k
            self._pend_all_h[:d] += hits.sum(0)
            slots = np.concatenate([np.asarray(entry[0]) for entry in raw])
            group = self._group[np.repeat([entry[1] for entry in raw], [len(entry[0]) for entry in raw])]
            n_tiers, w = len(self.tiers), 2 * d
            both = np.concatenate([trials, hits], axis=1)  # [N, 2D']
            keys, where = np.unique(slots * n_tiers + group, return_inverse=True)
            cols = np.arange(w)
            sums = np.bincount((where[:, None] * w + cols).ravel(), both.ravel(), len(keys) * w).reshape(-1, w)
            by = np.bincount((group[:, None] * w + cols).ravel(), both.ravel(), n_tiers * w).reshape(n_tiers, w)
            at, of = keys // n_tiers, keys % n_tiers  # each distinct key's slot and record
            for g in np.unique(of).tolist():  # a record shared by several tiers: added to each
                mine = of == g
                for t in self._shares[g]:
                    self._pend_trials[at[mine], t, :d] += sums[mine, :d]
                    self._pend_hits[at[mine], t, :d] += sums[mine, d:]
                    self._pend_k[t, :d] += by[g, :d]
                    self._pend_h[t, :d] += by[g, d:]
            self._pending_slots.append(np.unique(at))

    def fold(self) -> None:
        """The observations summed since the last fold into the records (each row's and the pooled
        running means take a fold's trials as one batch of them: the exact mean until `window`)."""
        if self._pace_dirty:  # the steps' pace into the costs, once a fold
            self._pace_dirty = False
            self._pace_version += 1
        if not self._pending:
            return
        if self._raw:
            self._sum_noted()
        self._pending, self._deferred, self._probed = 0, False, False
        self.version += 1
        touched = self._pending_slots[0] if len(self._pending_slots) == 1 else np.unique(
            np.concatenate(self._pending_slots))
        self._pending_slots = []
        # the depths up to the deepest with trials (deeper ones keep their records: a fold without
        # trials there changes nothing), the rows' records there alone
        d, self._pend_depth = self._span(self._pend_depth), 0
        at = (touched, slice(None), self._cut(d))
        mean, count = self.mean[at], self.count[at]
        _running_mean(mean, count, self._pend_trials[at], self._pend_hits[at], self.window)
        self.mean[at], self.count[at] = mean, count
        self._pend_trials[at] = 0
        self._pend_hits[at] = 0
        # (every tier at once: one without trials keeps its record, as its count is at most the window)
        _running_mean(self.tier_mean, self.tier_count, self._pend_k, self._pend_h, self.pooled_window)
        _running_mean(self.all_mean, self.all_count, self._pend_all_k, self._pend_all_h, self.pooled_window)
        for pend in (self._pend_k, self._pend_h, self._pend_all_k, self._pend_all_h):
            pend[:] = 0

    def acceptance(self, rows: list[int], depths: int | None = None) -> np.ndarray:
        """q [R, T, D]: each row's estimated acceptance per tier and depth (the first `depths`
        depths: each depth's estimate reads that depth's records alone)."""
        w = self.prior_weight
        d = self.depth if depths is None else depths
        tier = self._tier_estimate(d)  # [T, D]
        slots = np.asarray(rows)
        at = (slots, slice(None), self._cut(d))
        mean, count = self.mean[at], self.count[at]  # [R, T, D]
        # the row's ease: its accepted drafts over what every row's record under the same tiers
        # predicts (by depth, shrunk toward 1); a tier it has little record of takes every row's
        # record of that tier, scaled by the row's ease, never another tier's record (a chain's
        # top-1 drafts are accepted less often than a tree's top-k)
        hits, expected, seen = (count * mean).sum(1), (count * tier[None]).sum(1), count.sum(1)  # [R, D]
        prior = w * np.divide(expected, seen, out=np.ones_like(expected), where=seen > 0)  # w steps at the tiers' rate
        ease = np.divide(hits + prior, expected + prior, out=np.ones_like(hits), where=expected + prior > 0)
        own = np.clip(tier[None] * ease[:, None, :], 0.0, 1.0)  # [R, T, D]
        q = _shrink(mean, count, own, w)
        if self._bound:  # a tree drafts each chain's top-1 token among its top-k
            q[:, self._trees] = np.maximum(q[:, self._trees], q[:, self._chains].max(1, keepdims=True))
        return q

    def _tier_estimate(self, depths: int | None = None) -> np.ndarray:
        """[T, D]: every row's acceptance under each tier, shrunk toward every tier's, at the first
        `depths` depths (worked out once a version of the records, as deep as asked for: each
        depth's from the ones above it)."""
        d = self.depth if depths is None else depths
        if self._tier_version != self.version or self._tier.shape[1] < d:
            w = self.prior_weight
            pooled = np.empty(d)  # every row, every tier; a depth without data: the one above
            above = self.prior
            # (a recurrence over a few depths: Python floats, the same doubles as numpy's scalars, cheaper)
            for j, (m, c) in enumerate(zip(self.all_mean[:d].tolist(), self.all_count[:d].tolist())):
                above = pooled[j] = _shrink(m, c, above, w)
            self._tier = _shrink(self.tier_mean[:, :d], self.tier_count[:, :d], pooled[None], w)
            self._tier_version = self.version
        return self._tier[:, :d]

    def expected_tokens(self, rows: list[int], caps: list[int]) -> np.ndarray:
        """[R, T]: each row's expected tokens per step under each tier (worked out again only for
        rows whose records or depth cap changed since)."""
        slots, caps = np.asarray(rows), np.asarray(caps)
        stale = (self._tokens_version[slots] != self.version) | (self._tokens_cap[slots] != caps)
        tokens = self._tokens[slots]
        if stale.any():  # (a slot listed twice with two caps keeps the last)
            fresh, fresh_caps = slots[stale], caps[stale]
            tokens[stale] = self._tokens[fresh] = self._expected_tokens(fresh, fresh_caps)
            self._tokens_cap[fresh], self._tokens_version[fresh] = fresh_caps, self.version
        return tokens

    def prime(self, rows: list[int], caps: list[int]) -> None:
        """Joining rows (their slots and depth caps), while their prompts are prefilled: what the
        next choice would do first, done now (it is made while the card idles, after the prefill's
        first tokens are read): the fold of observations a held choice deferred (a row's joining
        ended the hold) and the new rows' expected tokens. Nothing is observed in between, so the
        choice is the same."""
        if not rows or self._hold_left:
            return
        if self._deferred:
            self.fold()
        self.expected_tokens(rows, caps)

    def _expected_tokens(self, rows, caps) -> np.ndarray:
        caps = np.asarray(caps)
        d = self._span(max(caps.tolist(), default=0))  # (no row reaches deeper: a wide batch's caps)
        q = self.acceptance(rows, d)
        reach = self._reach[None, :, :d] & (np.arange(d)[None, None, :] < caps[:, None, None])
        return 1.0 + (np.cumprod(q, axis=2) * reach).sum(2)

    def _span(self, depth: int) -> int:
        """How many depths a record's update or estimate works on to cover the first `depth`: a
        multiple of 8 (at least 8), or all of them. The depths past `depth` add zeros to a sum over
        depth, and numpy sums a row of 8 or more in 8 running parts: in a multiple of 8 a row's
        sum is then the same, bit for bit, as over every depth (the choices are the same); a wide
        batch's records are used to depth 15 where the ladder makes them 63 deep."""
        full = self.depth
        span = max(8, -(-depth // 8) * 8)
        return span if span <= full - full % 8 else full

    def _cut(self, span: int) -> slice:
        """The depth index of a record's first `span` depths (every depth: the plain slice, a little
        cheaper to index with)."""
        return slice(None) if span == self.depth else slice(span)

    def costs(self, batch: int, kv, context: int | None = None) -> np.ndarray:
        """[1 + T]: the step cost of plain decoding and of each tier at this batch bucket; kv is
        the context bucket of them all, or one per entry (a step reads its own tree's room: a
        plain step or a short chain may fit a smaller bucket than the full tree); context: the
        rows' mean tokens before the step, where known (a measured profile prices the step there:
        `SpeculationProfile.step`)."""
        kvs = tuple(int(k) for k in kv) if np.ndim(kv) else (int(kv),) * (1 + len(self.tiers))
        if len(kvs) != 1 + len(self.tiers):
            raise PolicyError(f"context buckets {kvs}: expected one, or one for plain decoding and each of the "
                              f"{len(self.tiers)} tiers")
        key = (batch, kvs, context, getattr(self.cost, "version", 0), self._pace_version)
        costs = self._costs.get(key)
        if costs is None:
            if len(self._costs) >= 4096:
                self._costs.clear()
            costs = np.array([self.cost.step(batch, k, t, context) for k, t in zip(kvs, [None, *self.tiers])])
            if self._pace and getattr(self.cost, "measured", False):  # (a static cost is not in ms)
                costs = np.maximum(costs, self._pace_floor(batch))
            self._costs[key] = costs
        return costs

    def _pace_floor(self, batch: int) -> np.ndarray:
        """[1 + T]: the least each tier's step can cost at this batch bucket by the pace read so far:
        its own pace, or where it has none yet, the most of any paced tier no deeper than it (a deeper
        tree emits as many tokens or more, so makes as much host work or more). Without the bound an
        unpaced tier, priced at its graph alone, would look cheaper than it runs."""
        depth = [0] + [t.steps for t in self.tiers]
        paced = {i: p[0] for i in range(len(depth))
                 if (p := self._pace.get((i, batch))) is not None and p[1] >= PACE_MIN_STEPS}
        return np.array([paced.get(i, max((p for j, p in paced.items() if depth[j] <= depth[i]), default=0.0))
                         for i in range(len(depth))])

    def paced(self, tier: int, batch: int, ms: float) -> None:
        """The engine read a step of this tier (0: plain) and batch bucket `ms` after the one before
        it, of the same tier and bucket, both run ahead of the host (module docstring)."""
        if not self.pace:
            return
        entry = self._pace.get((tier, batch))
        if entry is None:
            entry = self._pace[(tier, batch)] = [0.0, 0, ms]  # average, steps, the least seen
        entry[2] = min(entry[2], ms)
        entry[1] += 1
        # the exact mean of the first 1 / PACE_WEIGHT steps, then an average over about as many; a
        # pause (a collector pass, another process) counts at most 3x the least time seen
        entry[0] += max(1.0 / entry[1], PACE_WEIGHT) * (min(ms, 3 * entry[2]) - entry[0])
        self._pace_dirty = True

    def rates(self, rows: list, batch: int, kv, host_ms: float = 0.0, draining: bool = False,
              context: int | None = None) -> np.ndarray:
        """Expected tokens per unit of cost of plain decoding (index 0) and of each tier (kv: as
        `costs`). A row is None (it drafts nothing: one token), (record, depth cap), or (record,
        depth cap, chance): the chance that it drafts at all (a host drafter's proposal, not yet made).
        `draining`: no request waits for a row (module docstring: the rows' quantile, times their
        count). `context`: as `costs`. Asked again between folds in the same buckets (a narrow batch: for the same rows), it
        answers with the rates it gave."""
        draining = bool(draining and self.drain and len(rows) > 1)
        # a batch wider than FRESH_ROWS keeps its rates between folds while its buckets stay: rows that
        # join or leave meanwhile are weighed from the next fold (at most `refresh` steps on; a row
        # more or less moves every tier's rate and plain decoding's alike), and most steps cost the
        # host no estimate (module docstring)
        who = None if len(rows) > FRESH_ROWS else tuple(rows)
        key = (self.version, batch, _kv_key(kv), context, host_ms,
               getattr(self.cost, "version", 0), self._pace_version, draining, who)
        if self._last_rates is not None and self._last_rates[0] == key:
            return self._last_rates[1]
        drafting = [i for i, r in enumerate(rows) if r is not None]
        extra = np.zeros((len(rows), len(self.tiers)))  # expected tokens past the first, per row and tier
        if drafting:
            picked = [rows[i] for i in drafting]
            more = self.expected_tokens([r[0] for r in picked], [r[1] for r in picked]) - 1.0
            if max(map(len, picked)) > 2:
                more = np.array([r[2] if len(r) > 2 else 1.0 for r in picked])[:, None] * more
            if len(drafting) == len(rows):
                extra = more
            else:
                extra[drafting] = more
        if draining:
            tokens = len(rows) * (1.0 + np.quantile(extra, self.drain_quantile, axis=0))
        else:
            tokens = len(rows) + extra.sum(0)
        costs = self.costs(batch, kv, context)
        rates = np.concatenate([[len(rows) / costs[0]], tokens / (costs[1:] + host_ms)])
        self._last_rates = (key, rates)
        return rates

    def choose(self, rows: list, batch: int, kv, host_ms: float = 0.0, draining: bool = False,
               context: int | None = None) -> int:
        """The tier of the most expected tokens per unit of cost (0: plain decoding), or a probe
        (`draining`, `context`: as `rates`)."""
        if all(r is None for r in rows):
            return 0
        key = None  # (a narrow batch's choice may be held: `hold`)
        if self.hold and len(rows) <= FRESH_ROWS:
            key = (batch, _kv_key(kv), draining, tuple(rows))
        if self._hold_left and key is not None and self._held[0] == key and self._pending < self._held[3]:
            self._hold_left -= 1
            best, merit = self._held[1:3]
        else:
            self._hold_left = 0
            wide = len(rows) > BACKOFF_ROWS
            if self._deferred or (wide and batch != self._wide_bucket and self._pending):
                self.fold()  # (observations kept while a choice was held, or summed for another batch bucket)
            rates = self.rates(rows, batch, kv, host_ms, draining, context)
            best = int(np.argmax(rates[1:])) + 1
            if (best < len(self.tiers) and rates[best] < rates[-1] * (1.0 + self.switch_margin)
                    and rates[-1] > rates[0]):
                best = len(self.tiers)  # the full tree: the smaller one does not gain enough (and it beats plain)
            merit = bool(rates[best] > rates[0])
            if wide and self._wide_version != self.version:  # a fold's first estimate: the next fold's interval
                pick = best if merit else 0
                same = batch == self._wide_bucket and pick == self._wide_pick
                self._interval = min(2 * self._interval, self.refresh_max) if same else self.refresh
                self._wide_bucket, self._wide_pick, self._wide_version = batch, pick, self.version
            elif not wide:
                self._interval, self._wide_bucket = self.refresh, None
            if key is not None:  # a lead of L: held for L / hold choices (at most HOLD_STEPS)
                steps = min(int(self._lead(rates, best, merit) / self.hold), HOLD_STEPS)
                if steps > 0:  # (as many observations end it too: a step observes once)
                    self._held, self._hold_left = (key, best, merit, self._pending + steps), steps
        if merit:
            self.probe_interval = self.probe_every
        self.probing = not merit and self.plain_run + 1 >= self.probe_interval
        if merit or self.probing:
            if self.explore_every and self.idle.max() >= self.explore_every:
                # the longest-idle tier (the larger one of a tie: the full tree first at the start)
                return len(self.tiers) - int(np.argmax(self.idle[::-1]))
            if self.full_share:
                due = self._refresh(len(rows), best, batch, kv, context)
                if due:
                    return due
            return best
        return 0

    def _refresh(self, rows: int, best: int, batch: int, kv, context) -> int:
        """The tier (1-based) to run instead of the chosen one so that its record follows the requests
        of now (`full_share`, `share_all`: module docstring), or 0: a tier is due once its drafting
        steps since it last ran, times full_share, reach what running it now would cost, the most
        overdue first."""
        full = len(self.tiers)
        if not self.share_all:  # the full tree alone (scalars: this runs at most steps of a wide batch)
            if best == full:
                return 0
            costs = self.costs(batch, kv, context)
            return full if self.idle[-1] * self.full_share >= costs[-1] / costs[best] - 1.0 else 0
        if self.share_all == 2 and rows > SHARE_ALL_ROWS and self._last_rates is not None:
            rates = self._last_rates[1]  # (worked out for this choice: a wide batch holds no choice)
            cost = np.maximum(1.0 - rates[1:] / max(rates[best], 1e-12), 0.0)  # the share of tokens/s given up
            cost[best - 1] = np.inf
        elif best == full:
            return 0
        else:  # every dearer tier by the share of time its step takes over the chosen one's (Python scalars:
            # this runs at every choice of a smaller tier, a handful of tiers; the most overdue, the first of a tie)
            costs = self.costs(batch, kv, context).tolist()
            chosen, pick, most = costs[best], 0, -math.inf
            for t, (c, idle) in enumerate(zip(costs[1:], self.idle.tolist()), 1):
                if c > chosen and (due := idle * self.full_share - (c / chosen - 1.0)) > most:
                    pick, most = t, due
            return pick if most >= 0.0 else 0
        due = self.idle * self.full_share - cost
        t = int(np.argmax(due))
        return t + 1 if due[t] >= 0.0 else 0

    def _lead(self, rates: np.ndarray, best: int, merit: bool) -> float:
        """By what share the rate of the option nearest to replacing this choice would have to
        rise (or the choice's own fall) to replace it: the full tree gives way to a smaller tier
        only past `switch_margin`, and a drafting choice to plain decoding at an equal rate."""
        full, margin = len(self.tiers), 1.0 + self.switch_margin
        if not merit:  # plain decoding: the best tier must reach its rate
            return float(rates[0] / rates[best]) - 1.0
        rivals = [rates[0]]
        for t in range(1, full + 1):
            if t == best:
                continue
            if best == full:
                rivals.append(rates[t] / margin)  # a smaller tier needs the margin over the full tree
            elif t == full:
                rivals.append(rates[t] * margin)  # the smaller tier keeps the margin over the full tree
            else:
                rivals.append(rates[t])
        return float(rates[best] / max(rivals)) - 1.0

    def launched(self, tier: int) -> None:
        """The engine launched a step of this tier (where some row wanted drafts)."""
        self.plain_run = self.plain_run + 1 if tier == 0 else 0
        if tier and self.probing:  # (a host drafter's plan may be made twice a step: doubled once, here)
            self.probe_interval = min(2 * self.probe_interval, self.probe_every * self.probe_backoff)
            self._probed = True
            self._interval = self.refresh  # (its observation is folded at once; folds come often again)
        self.probing = False
        if tier:
            self.idle += 1
            self.idle[tier - 1] = 0


def default_policy(cuda: bool, tiers=None, profile=None, settings=None) -> str:
    """The commands' default: adaptive on a GPU (and wherever tiers, a profile or settings are
    given), fixed on a CPU, where no step costs are measured. Speculative outputs are
    bit-identical to plain decoding in bf16, so the policy never changes an output, only the
    speed (docs/benchmarks.md, "Speculation policy")."""
    return "adaptive" if cuda or tiers or profile or settings else "fixed"


# the adaptive policy's settings a user may change (AdaptivePolicy's keyword arguments), by type
POLICY_SETTINGS = {"window": int, "prior": float, "prior_weight": float, "pooled_window": int, "probe_every": int,
                   "explore_every": int, "switch_margin": float, "probe_backoff": int, "share_chains": int,
                   "bound_trees": int, "refresh": int, "drain": int, "drain_quantile": float, "pace": int,
                   "full_share": float, "hold": float, "share_all": int, "refresh_max": int}
SETTINGS_HELP = "NAME=VALUE[,NAME=VALUE...] with NAME one of " + ", ".join(POLICY_SETTINGS)


def setting_value(name: str, value, what: str = "--speculation-settings"):
    """One adaptive-policy setting, cast to its type and checked for range."""
    if name not in POLICY_SETTINGS:
        raise PolicyError(f"{what}: unknown setting {name!r}; expected {SETTINGS_HELP}")
    kind = POLICY_SETTINGS[name]
    try:
        v = kind(value)
    except (TypeError, ValueError):
        raise PolicyError(f"{what}: {name}={value!r} is not {'an integer' if kind is int else 'a number'}") from None
    if name == "prior" and not 0.0 <= v <= 1.0:
        raise PolicyError(f"{what}: prior={v} must lie in [0, 1] (an acceptance rate)")
    low = 1 if name in ("window", "pooled_window", "probe_every", "probe_backoff", "refresh") else 0
    if name in ("share_chains", "bound_trees", "drain", "pace") and v not in (0, 1):
        raise PolicyError(f"{what}: {name}={v} must be 0 or 1")
    if name == "share_all" and v not in (0, 1, 2):
        raise PolicyError(f"{what}: share_all={v} must be 0 (the full tree), 1 (every dearer tier) or 2 (every "
                          f"tier by the tokens/s it gives up, in batches of more than {SHARE_ALL_ROWS} rows)")
    if name == "drain_quantile" and not 0.0 <= v <= 1.0:
        raise PolicyError(f"{what}: drain_quantile={v} must lie in [0, 1] (0: the slowest row's rate)")
    if name != "prior" and not (v >= low and math.isfinite(v)):
        raise PolicyError(f"{what}: {name}={v} must be at least {low}")
    return v


def parse_settings(spec, what: str = "--speculation-settings") -> dict:
    """'NAME=VALUE,...' or a dict -> the adaptive policy's keyword arguments (checked)."""
    if spec is None:
        return {}
    if isinstance(spec, str):
        items = {}
        for item in (x for x in spec.replace(" ", "").split(",") if x):
            name, eq, value = item.partition("=")
            if not eq or not value:
                raise PolicyError(f"{what}: {item!r} is not NAME=VALUE; expected {SETTINGS_HELP}")
            items[name] = value
        spec = items
    return {name: setting_value(name, value, what) for name, value in dict(spec).items()}


def build_policy(name: str, full: TreeShape, tiers=None, trees: bool = True, can_tier: bool = False, cost=None,
                 settings=None):
    """`fixed` (the engine's tree every step) or `adaptive` (tiers as given, or the defaults;
    `settings`: AdaptivePolicy's keyword arguments, parse_settings)."""
    if name == "fixed":
        if tiers is not None:
            raise PolicyError("--speculation-tiers applies to --speculation-policy adaptive; the fixed policy "
                              "verifies the engine's tree (--num-steps, --topk, --num-draft-tokens) every step")
        if settings:
            raise PolicyError("--speculation-settings apply to --speculation-policy adaptive; the fixed policy "
                              "has none")
        return FixedPolicy(full)
    if name == "adaptive":
        return AdaptivePolicy(resolve_tiers(tiers, full, trees, can_tier), cost or StaticCost(),
                              **parse_settings(settings))
    raise PolicyError(f"speculation policy {name!r} is not one of {', '.join(POLICIES)}")
