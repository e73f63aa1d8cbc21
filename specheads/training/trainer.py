"""The training loop: target features -> the head kind's unroll -> its loss -> optimizer step.

Runs the same under `deepspeed`, `torchrun` and plain `python`. With a DeepSpeed config
(ZeRO-1/2), DeepSpeed owns precision, gradient reduction and checkpoints; without one,
a single process trains with torch AdamW (bf16 autocast on GPU, fp32 on CPU).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from specheads.config import SHAPE_OPTIONS, RunConfig
from specheads.heads.format import HeadFormatError, load_head, save_head
from specheads.heads.registry import HeadKindError, head_kind
from specheads.training.checkpoints import (
    checkpoint_problem,
    deepspeed_safe_globals,
    finished_checkpoints,
    load_deepspeed_weights_only,
    load_state,
    prune_checkpoints,
    reject_checkpoint,
    write_done,
    write_manifest,
)
from specheads.training.data import collate, epoch_batches, load_prepared
from specheads.training.ttt import chain_acceptance, opening_mask, shift_left

OPENING_TOKENS = 256  # eval/accept_length_opening: the first answer's first tokens


class TrainingError(ValueError):
    pass


# ---------------------------------------------------------------- distributed glue
def dist_env() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(world: int, device: torch.device, use_deepspeed: bool) -> None:
    if world == 1 or torch.distributed.is_initialized():
        return
    if use_deepspeed:
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    else:
        raise TrainingError(
            f"launched with WORLD_SIZE={world} but no DeepSpeed config; "
            "pass --set train.deepspeed=configs/ds_zero2.json (or ds_zero1.json)"
        )


def barrier(world: int) -> None:
    if world > 1 and torch.distributed.is_initialized():
        torch.distributed.barrier()


def ranks_where(flag: bool, world: int, device: torch.device) -> list[int]:
    """The ranks on which `flag` holds, the same list on every rank (a collective: all ranks call it)."""
    rank = int(os.environ.get("RANK", 0))
    if world == 1 or not torch.distributed.is_initialized():
        return [rank] if flag else []
    t = torch.zeros(world, dtype=torch.int32, device=device)
    t[rank] = int(flag)
    torch.distributed.all_reduce(t)
    return [r for r, f in enumerate(t.tolist()) if f]


def from_main(value: int, world: int, device: torch.device) -> int:
    """Rank 0's value on every rank."""
    if world == 1 or not torch.distributed.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.int64, device=device)
    torch.distributed.broadcast(t, src=0)
    return int(t.item())


def nonfinite_tensors(module: torch.nn.Module, dtype: torch.dtype | None = None) -> list[str]:
    """Names of the parameters and buffers holding a NaN or Inf (once cast to dtype, if given:
    float16 overflows where float32 does not)."""
    return [name for name, t in [*module.named_parameters(), *module.named_buffers()]
            if t.is_floating_point() and not bool(torch.isfinite(t.detach().to(dtype or t.dtype)).all())]


def deepspeed_config(path: str, cfg: RunConfig, device: torch.device) -> dict:
    p = Path(path)
    if not p.is_file():
        raise TrainingError(f"DeepSpeed config {path!r} does not exist (see configs/ds_zero1.json, ds_zero2.json)")
    ds = json.loads(p.read_text())
    fill = {
        "train_micro_batch_size_per_gpu": cfg.train.batch_size,
        "gradient_accumulation_steps": cfg.train.grad_accum,
        "gradient_clipping": cfg.train.max_grad_norm,
    }
    for k, v in fill.items():
        if ds.get(k, "auto") == "auto":
            ds[k] = v
    ds.pop("train_batch_size", None)
    bf16 = device.type == "cuda"
    for key in ("bf16", "fp16"):
        section = ds.setdefault(key, {})
        if section.get("enabled", "auto") == "auto":
            section["enabled"] = bf16 if key == "bf16" else False
    if device.type == "cpu" and ds["bf16"]["enabled"]:
        raise TrainingError(f"{path}: bf16 is not available on CPU; set bf16.enabled to \"auto\" or false")
    ds.setdefault("zero_allow_untested_optimizer", True)
    ds.setdefault("steps_per_print", 10**9)
    return ds


# ---------------------------------------------------------------- schedule
def lr_lambda(total: int, warmup: int, min_ratio: float):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / max(warmup, 1)
        progress = min((step - warmup) / max(total - warmup, 1), 1.0)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


# ---------------------------------------------------------------- signals
class StopRequest:
    """SIGTERM / SIGINT (a scheduler's time limit, `timeout`, Ctrl-C) ask the loop to stop at the
    next step boundary: it saves a checkpoint there and returns, so the same command resumes."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._old = {}

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: no handler, the default behaviour stays
                pass
        return self

    def _handle(self, signum, frame) -> None:
        if self.signum is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False

    def agreed(self, world: int, device: torch.device) -> bool:
        """Every rank stops at the same step (any rank's signal counts)."""
        return bool(ranks_where(self.signum is not None, world, device))


# ---------------------------------------------------------------- the run
class Trainer:
    def __init__(self, cfg: RunConfig):
        self.cfg = cfg
        self.rank, self.world, self.local_rank = dist_env()
        self.device = pick_device(self.local_rank)
        self.use_ds = cfg.train.deepspeed is not None
        init_distributed(self.world, self.device, self.use_ds)
        self.out = Path(cfg.output_dir)
        self.ckpt_dir = self.out / "checkpoints"
        self.is_main = self.rank == 0
        self.nonfinite_skipped = 0  # steps skipped under train.skip_nonfinite, this run and the ones it resumed
        self.last_checkpoint: Path | None = None
        torch.manual_seed(cfg.train.seed)
        random.seed(cfg.train.seed)

    def log(self, msg: str) -> None:
        if self.is_main:
            print(msg, flush=True)

    def warn(self, msg: str) -> None:
        if self.is_main:
            print(f"warning: {msg}", file=sys.stderr, flush=True)

    # .............................................................. setup
    def resolve_global_batch(self) -> None:
        """train.global_batch_size: the accumulation steps this number of processes needs."""
        t = self.cfg.train
        if t.global_batch_size is None:
            return
        per = t.batch_size * self.world
        if t.global_batch_size % per:
            raise TrainingError(
                f"train.global_batch_size={t.global_batch_size} is not a multiple of train.batch_size x processes = "
                f"{t.batch_size} x {self.world} = {per}: set it to a multiple of {per}, or change train.batch_size")
        accum = t.global_batch_size // per
        if "grad_accum" in t.model_fields_set and t.grad_accum != accum:
            raise TrainingError(
                f"train.grad_accum={t.grad_accum} and train.global_batch_size={t.global_batch_size} disagree on "
                f"{self.world} process(es) x train.batch_size {t.batch_size} (it would be {accum}): set one of them")
        t.grad_accum = accum

    def setup(self) -> None:
        from specheads.target.loader import load_target

        cfg = self.cfg
        self.resolve_global_batch()
        data = load_prepared(cfg.data.path, cfg.data.max_length)
        self.data = data
        dtype = {"auto": torch.bfloat16 if self.device.type == "cuda" else torch.float32, "bfloat16": torch.bfloat16,
                 "float32": torch.float32, "float16": torch.float16}[cfg.target.dtype]
        self.compute_dtype = dtype
        target_spec = cfg.target.path or data.report.get("target_dir") or None
        self.target, self.tokenizer, self.target_dir = load_target(target_spec, dtype=dtype, device=self.device)
        # q/k/v and gate/up as one weight each (views: no memory added), so that every capture
        # forward does not concatenate them again
        self.target.fuse_for_inference()
        prepared_tok = data.report.get("tokenizer_size", data.report.get("vocab_size"))
        if prepared_tok is not None and prepared_tok != len(self.tokenizer):
            raise TrainingError(
                f"data {cfg.data.path!r} was prepared with a tokenizer of {prepared_tok} tokens, "
                f"but target {str(self.target_dir)!r} has {len(self.tokenizer)}; prepare it again for this target"
            )
        if data.t2d.numel() != self.target.spec.vocab_size:
            raise TrainingError(
                f"vocab map of {cfg.data.path!r} covers {data.t2d.numel()} tokens, the target's vocab is "
                f"{self.target.spec.vocab_size}"
            )
        try:
            self.kind = head_kind(cfg.head.kind)
        except HeadKindError as e:
            raise TrainingError(f"head.kind: {e}") from None
        self.readout_started_from_target = False  # readout_from_target: the lm_head starts as the target's rows
        if cfg.train.init_from:
            head = self.initial_head(cfg.train.init_from)
            head_cfg = head.config
        else:
            head_cfg = self.kind.config.for_target(
                self.target, int(data.d2t.numel()), cfg.target.layer_ids, intermediate_size=cfg.head.intermediate_size,
                **cfg.head.shape_options(),
            )
            torch.manual_seed(cfg.train.seed)
            head = self.kind.module(head_cfg)
            head.set_vocab_map(data.d2t, data.t2d)
            self.readout_from_target(head, cfg.head.lm_head_from_target)
        self.frozen_readout = self.freeze_readout(head, head_cfg)
        param_dtype = torch.float32
        self.head = head.to(self.device, param_dtype)
        if hasattr(self.head, "attach_target"):  # a head that reads out through the target's lm_head (EAGLE-1)
            self.head.attach_target(self.target)
        self.embed = self.target.embed_tokens
        rows = self.head.target_rows()
        self.teacher_weight = self.target.lm_head.weight[rows].detach()
        self.layer_ids = head_cfg.target_layer_ids
        depth = head_cfg.fixed_depth()
        if depth is not None and cfg.train.ttt_steps < depth:
            raise TrainingError(f"train.ttt_steps={cfg.train.ttt_steps} would train {cfg.train.ttt_steps} of this "
                                f"{self.kind.title} head's {depth} draft depths (the others stay random): set "
                                f"train.ttt_steps >= {depth}")
        trained = min(cfg.train.ttt_steps, depth) if depth is not None else cfg.train.ttt_steps
        weights = cfg.train.depth_weights
        if weights is not None and len(weights) != trained:
            raise TrainingError(f"train.depth_weights has {len(weights)} weights; this run trains {trained} depths "
                                f"(train.ttt_steps={cfg.train.ttt_steps}"
                                + (f", the {self.kind.title} head's {depth}" if depth is not None else "")
                                + f"): give {trained} weights, one per depth")
        # schedule
        n_batches = len(epoch_batches([len(x) for x in data.train_ids], cfg.train.batch_size, cfg.train.seed, 0,
                                      self.rank, self.world, self.world * cfg.train.grad_accum))
        self.micro_per_epoch = n_batches
        if cfg.train.max_steps:
            self.total_steps = cfg.train.max_steps
        else:
            self.total_steps = max(1, int(cfg.train.epochs * n_batches) // cfg.train.grad_accum)
        warmup = int(cfg.train.warmup_ratio * self.total_steps)
        params = [p for p in self.head.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, betas=(0.9, 0.95), weight_decay=cfg.train.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(self.total_steps, warmup, cfg.train.min_lr_ratio)
        )
        self.engine = None
        if self.use_ds:
            import deepspeed

            ds_cfg = deepspeed_config(cfg.train.deepspeed, cfg, self.device)
            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=self.head, optimizer=self.optimizer, lr_scheduler=self.scheduler, config=ds_cfg
            )
            self.head = self.engine.module
            load_deepspeed_weights_only(self.engine)
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if self.device.type == "cuda" and not self.use_ds
            else nullcontext()
        )
        if cfg.train.mode == "offline":
            self.setup_offline()
        self.log(
            f"target {self.target_dir} ({self.target.spec.num_hidden_layers} layers, hidden {self.target.spec.hidden_size}); "
            f"head {self.kind.name}, draft vocab {head_cfg.draft_vocab_size}, layers {self.layer_ids}; "
            f"{len(data.train_ids)} train / {len(data.eval_ids)} eval conversations; "
            f"{self.total_steps} optimizer steps x {cfg.train.grad_accum} accum x {self.world} procs x "
            f"batch {cfg.train.batch_size}; device {self.device}"
            + (f", DeepSpeed {cfg.train.deepspeed}" if self.use_ds else "")
        )

    def readout_from_target(self, head, asked: bool | None) -> None:
        """head.lm_head_from_target: a new head's lm_head (and final norm) start as the target's
        rows (None: the kind's default)."""
        takes = hasattr(head, "init_readout_from_target")
        if asked and not takes:
            raise TrainingError(f"head.lm_head_from_target does not apply to {self.kind.title} heads "
                                "(they read out through the target's lm_head itself, or have no lm_head): drop it")
        self.readout_started_from_target = bool(getattr(head, "lm_head_from_target", False) if asked is None else asked)
        if self.readout_started_from_target:
            head.init_readout_from_target(self.target)

    def freeze_readout(self, head, head_cfg) -> list[str]:
        """head.freeze_lm_head: the draft lm_head(s) kept as they start (None: the head's default,
        `freezes_full_vocab_lm_head`: an MTP head over the whole vocabulary reads out through the
        target's own lm_head rows, frozen). Returns the frozen parameters' names."""
        asked = self.cfg.head.freeze_lm_head
        own = {id(p) for m in (head.readout_heads() if hasattr(head, "readout_heads") else []) for p in m.parameters()}
        names = [n for n, p in head.named_parameters() if id(p) in own]
        full = head_cfg.draft_vocab_size == self.target.spec.vocab_size
        if asked is None:
            asked = bool(getattr(head, "freezes_full_vocab_lm_head", False) and full and names
                         and (self.cfg.train.init_from or self.readout_started_from_target))
        if not asked:
            return []
        if not names:
            raise TrainingError(f"head.freeze_lm_head does not apply to {self.kind.title} heads (they have no lm_head "
                                "of their own): drop it")
        if not (self.cfg.train.init_from or self.readout_started_from_target):
            raise TrainingError("head.freeze_lm_head=true keeps the lm_head as it starts, and this run starts it "
                                "random: set head.lm_head_from_target=true (or train.init_from a trained head)")
        params = dict(head.named_parameters())
        for n in names:
            params[n].requires_grad_(False)
        return names

    def initial_head(self, spec: str) -> torch.nn.Module:
        """The head named by train.init_from, checked against the target and the run's head options."""
        cfg = self.cfg
        try:
            head = load_head(spec, dtype=torch.float32)
        except (HeadFormatError, OSError) as e:
            raise TrainingError(f"train.init_from {spec!r}: {e}") from None
        if head.kind != self.kind.name:
            raise TrainingError(f"train.init_from {spec!r} holds a head of kind {head.kind}, the run trains "
                                f"head.kind={self.kind.name}; set head.kind={head.kind} (--kind {head.kind})")
        hc = head.config
        problems = self.kind.mismatches(hc, self.target.spec)
        size = getattr(hc, "intermediate_size", None)
        if cfg.head.intermediate_size is not None and cfg.head.intermediate_size != size:
            problems.append(f"head.intermediate_size={cfg.head.intermediate_size}, the head has {size}")
        for name, value in cfg.head.shape_options().items():
            if value != getattr(hc, name, None):
                problems.append(f"head.{name}={value}, the head has {getattr(hc, name, None)}")
        if cfg.target.layer_ids is not None and list(cfg.target.layer_ids) != list(hc.target_layer_ids):
            problems.append(f"target.layer_ids={cfg.target.layer_ids}, the head reads {hc.target_layer_ids}")
        if problems:
            raise TrainingError(f"train.init_from {spec!r} does not fit this run: " + "; ".join(problems)
                                + " (drop the conflicting options, or start from random weights)")
        self.log(f"starting from head {spec} (draft vocab {hc.draft_vocab_size}, MLP {hc.intermediate_size}); "
                 "its vocab map replaces the data's")
        return head

    def setup_offline(self) -> None:
        from specheads.training.offline import ShardReader, build_cache

        cfg = self.cfg
        folder = Path(cfg.train.offline_cache_dir or (self.out / "hidden_cache"))
        fingerprint = {
            "data": str(Path(cfg.data.path).resolve()),
            "target": str(self.target_dir),
            "layers": self.layer_ids,
            "max_length": cfg.data.max_length,
            "dtype": str(self.compute_dtype),
            "rows": len(self.data.train_ids),
        }
        if self.is_main:
            build_cache(self.target, self.data.train_ids, self.layer_ids, folder, self.cfg.train.batch_size, fingerprint)
        barrier(self.world)
        self.reader = ShardReader(folder)

    # .............................................................. one micro-batch
    def features(self, indices: list[int], ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cfg.train.mode == "offline":
            return self.reader.batch(indices, self.device)
        with torch.no_grad():
            out = self.target(ids, capture_layers=self.layer_ids, return_logits=False)
        return out.aux_hidden, out.hidden

    def head_dtype(self) -> torch.dtype:
        return next(self.head.parameters()).dtype

    def micro_step(self, indices: list[int]):
        ids, mask = collate([self.data.train_ids[i] for i in indices], [self.data.train_mask[i] for i in indices])
        ids, mask = ids.to(self.device), mask.to(self.device)
        aux, hidden = self.features(indices, ids)
        dt = self.head_dtype()
        with self.autocast:
            stats = self.head_loss(lambda x: self.embed(x).to(dt), ids, mask, aux.to(dt), hidden.to(dt),
                                   self.teacher_weight.to(dt))
        loss = stats.loss
        if self.engine is not None:
            self.engine.backward(loss)
        else:
            (loss / self.cfg.train.grad_accum).backward()
        return stats, int(ids.numel())

    def head_loss(self, embed, ids, mask, aux, hidden, teacher_weight, outputs=None):
        """The kind's loss over its unroll of this batch (`outputs`: that unroll, where made already)."""
        train = self.cfg.train
        if outputs is None:
            outputs = self.kind.unroll(self.head, embed, ids, aux, train.ttt_steps)
        return self.kind.loss(self.head, embed, ids, mask, aux, hidden, teacher_weight, train.ttt_steps,
                              train.depth_weights or train.step_decay, train.loss_chunk, outputs=outputs)

    # .............................................................. evaluation
    @torch.no_grad()
    def evaluate(self) -> dict:
        cfg = self.cfg
        steps = cfg.train.ttt_steps
        rows = list(range(min(len(self.data.eval_ids), cfg.data.eval_max_rows)))
        if not rows:
            return {}
        self.head.eval()
        dt = self.head_dtype()
        loss = torch.zeros(steps, dtype=torch.float64)
        correct = torch.zeros(steps, dtype=torch.float64)
        counted = torch.zeros(steps, dtype=torch.float64)
        accept_sum, accept_n = 0.0, 0
        open_sum, open_n = 0.0, 0
        chain_correct = torch.zeros(steps, dtype=torch.float64)
        for s in range(0, len(rows), cfg.train.batch_size):
            chunk = rows[s : s + cfg.train.batch_size]
            ids, mask = collate([self.data.eval_ids[i] for i in chunk], [self.data.eval_mask[i] for i in chunk])
            ids, mask = ids.to(self.device), mask.to(self.device)
            out = self.target(ids, capture_layers=self.layer_ids, return_logits=False)
            with self.autocast:
                embed = lambda x: self.embed(x).to(dt)  # noqa: E731
                aux, hidden = out.aux_hidden.to(dt), out.hidden.to(dt)
                unrolled = self.kind.unroll(self.head, embed, ids, aux, steps)  # shared by both metrics
                st = self.head_loss(embed, ids, mask, aux, hidden, self.teacher_weight.to(dt), outputs=unrolled)
                cc, accept = chain_acceptance(self.head, embed, ids, mask, aux, hidden,
                                              self.target.lm_head.weight.to(dt), steps, outputs=unrolled)
            depth = len(unrolled)  # ttt_steps, or fewer for a kind of fixed depth (MTP modules, Medusa heads)
            for k in range(depth):
                loss[k] += float(st.step_loss[k]) * st.rows
                correct[k] += float(st.step_correct[k])
                counted[k] += st.step_rows[k]
            chain_correct[:depth] += cc.double().cpu()
            accept_sum += float(accept.double().sum())
            accept_n += int(accept.numel())
            # accept[i] belongs to the i-th row of chain_acceptance's base (next-next token an answer's)
            opening = shift_left(opening_mask(mask, OPENING_TOKENS), 2).bool()[shift_left(mask, 2).bool()]
            open_sum += float(accept[opening].double().sum())
            open_n += int(opening.sum())
        self.head.train()
        n0 = max(counted[0].item(), 1)
        loss, correct, counted, chain_correct = loss[:depth], correct[:depth], counted[:depth], chain_correct[:depth]
        return {
            "eval/loss": [round(x, 4) for x in (loss / n0).tolist()],
            "eval/acc": [round(x, 4) for x in (correct / counted.clamp(min=1)).tolist()],
            "eval/chain_acc": [round(x, 4) for x in (chain_correct / max(accept_n, 1)).tolist()],
            "eval/accept_length": round(accept_sum / max(accept_n, 1), 4),
            "eval/positions": accept_n,
            "eval/accept_length_opening": round(open_sum / max(open_n, 1), 4),
            "eval/positions_opening": open_n,
        }

    # .............................................................. checkpoints
    def check_head_finite(self, what: str, dtype: torch.dtype | None = None) -> None:
        """A head with NaN/Inf weights is never written: every rank holds the full weights (ZeRO-1/2),
        so every rank reaches the same verdict and raises together."""
        bad = nonfinite_tensors(self.head, dtype)
        if bad:
            in_dtype = f" in {str(dtype).replace('torch.', '')}" if dtype is not None else ""
            since = f"; the last checkpoint, {self.last_checkpoint}, predates this" if self.last_checkpoint else ""
            raise TrainingError(
                f"not saving {what}: the head's tensors {bad[:5]} hold NaN/Inf{in_dtype}{since}. Lower train.lr or "
                f"train.max_grad_norm, or set train.skip_nonfinite=true to skip steps whose loss is not finite"
            )

    def save_checkpoint(self, step: int) -> None:
        self.check_head_finite(f"the checkpoint of step {step}")
        tag = f"step_{step}"
        final = self.ckpt_dir / tag
        wall, tokens = self._so_far()
        client_state = {"step": step, "head_config": self.head.config.to_dict(),
                        "nonfinite_steps_skipped": self.nonfinite_skipped,
                        "train_wall_s": wall, "tokens_seen": tokens}  # a resumed run's summary counts them
        if self.engine is not None:
            if self.is_main:  # a leftover folder of that step (an abandoned run) must not mix into this one
                shutil.rmtree(final, ignore_errors=True)
            barrier(self.world)
            self.engine.save_checkpoint(str(self.ckpt_dir), tag=tag, client_state=client_state)
            barrier(self.world)
            if self.is_main:  # every rank's files are on disk: one manifest covers them all
                write_manifest(final)
                write_done(final, step)
                prune_checkpoints(self.ckpt_dir, self.cfg.train.keep_checkpoints)
            self.last_checkpoint = final
            return
        self.last_checkpoint = final
        if not self.is_main:
            return
        tmp = self.ckpt_dir / f".{tag}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # plain tensors, dicts, lists and numbers only: it loads with weights_only=True
        torch.save(
            {
                "head": self.head.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": torch.get_rng_state(),
                **client_state,
            },
            tmp / "state.pt",
        )
        write_manifest(tmp)
        write_done(tmp, step)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        prune_checkpoints(self.ckpt_dir, self.cfg.train.keep_checkpoints)

    def _so_far(self) -> tuple[float, int]:
        """Training seconds and this rank's tokens over the whole run, the calls before a resume
        included (the loop in progress up to now)."""
        wall = getattr(self, "_wall_before", 0.0)
        tokens = getattr(self, "_tokens_before", 0)
        if getattr(self, "_t_start", None) is not None:
            wall += time.time() - self._t_start
            tokens += self._tokens_seen
        return wall, tokens

    def intact_checkpoint(self) -> Path | None:
        """The newest checkpoint whose files match its manifest. Rank 0 verifies and sets aside the
        ones that fail (with a warning naming the file); every rank then loads the same step."""
        chosen, rejected = -1, 0
        if self.is_main:
            allowed = deepspeed_safe_globals() if self.use_ds else None
            for step, folder in reversed(finished_checkpoints(self.ckpt_dir)):
                problem = checkpoint_problem(folder, allowed)
                if problem is None:
                    chosen = step
                    break
                moved = reject_checkpoint(folder)
                rejected += 1
                self.warn(f"checkpoint {folder} is not intact: {problem}; moved it to {moved.name} and falling "
                          "back to the previous checkpoint")
            if chosen < 0 and rejected:
                self.warn(f"no intact checkpoint left in {self.ckpt_dir}: training starts again from step 0")
        chosen = from_main(chosen, self.world, self.device)
        return self.ckpt_dir / f"step_{chosen}" if chosen >= 0 else None

    def maybe_resume(self) -> int:
        if self.cfg.train.resume == "never":
            return 0
        ckpt = self.intact_checkpoint()
        if ckpt is None:
            return 0
        # the manifest check above runs before any of these files is unpickled, and every load is
        # weights_only (DeepSpeed's through load_deepspeed_weights_only)
        if self.engine is not None:
            states = list(ckpt.glob("mp_rank_00_model_states.pt"))
            if states:
                saved = load_state(states[0], safe_globals=deepspeed_safe_globals())
                self.check_resumable(ckpt, saved.get("head_config"))
            _, client = self.engine.load_checkpoint(str(self.ckpt_dir), tag=ckpt.name)
            step = int(client["step"])
            self.nonfinite_skipped = int(client.get("nonfinite_steps_skipped", 0))
            self._wall_before = float(client.get("train_wall_s", 0.0))
            self._tokens_before = int(client.get("tokens_seen", 0))
        else:
            state = load_state(ckpt / "state.pt", map_location=self.device)
            self.check_resumable(ckpt, state.get("head_config"))
            self.head.load_state_dict(state["head"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            torch.set_rng_state(state["rng"].cpu())
            step = int(state["step"])
            self.nonfinite_skipped = int(state.get("nonfinite_steps_skipped", 0))
            self._wall_before = float(state.get("train_wall_s", 0.0))
            self._tokens_before = int(state.get("tokens_seen", 0))
        self.last_checkpoint = ckpt
        self.log(f"resumed from {ckpt} at step {step}")
        return step

    def check_resumable(self, ckpt: Path, saved: dict | None) -> None:
        """A checkpoint of another target or head shape must not half-load."""
        if saved is None:
            return
        now = self.head.config.to_dict()
        try:  # fields added since the checkpoint was written compare at their defaults
            saved = type(self.head.config).from_dict(saved).to_dict()
        except TypeError:  # fields removed since: compare as saved
            pass
        diff = {k: (saved.get(k), v) for k, v in now.items() if saved.get(k) != v}
        if diff:
            detail = ", ".join(f"{k}: checkpoint {a} vs now {b}" for k, (a, b) in diff.items())
            raise TrainingError(
                f"checkpoint {ckpt} was written for another head/target ({detail}); "
                f"use a new output_dir or --set train.resume=never"
            )

    # .............................................................. loop
    def batch_for(self, micro_index: int) -> list[int]:
        epoch, pos = divmod(micro_index, self.micro_per_epoch)
        if getattr(self, "_epoch_plan", (None,))[0] != epoch:  # plan each epoch once, not every step
            lengths = [len(x) for x in self.data.train_ids]
            self._epoch_plan = (epoch, epoch_batches(lengths, self.cfg.train.batch_size, self.cfg.train.seed,
                                                     epoch, self.rank, self.world,
                                                     self.world * self.cfg.train.grad_accum))
        return self._epoch_plan[1][pos]

    def run(self) -> dict:
        from tqdm.auto import tqdm

        from specheads.training.report import MetricsLog

        cfg = self.cfg
        self.setup()
        start = self.maybe_resume()
        metrics = MetricsLog(self.out, cfg, enabled=self.is_main, resumed=start > 0)
        self.head.train()
        bar = tqdm(total=self.total_steps, initial=start, desc="train", unit="step", disable=not self.is_main)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        stop = StopRequest()
        with stop:
            stopped_at = self._loop(start, metrics, bar, stop)
        bar.close()
        if stopped_at is not None:
            self.save_checkpoint(stopped_at)
            self.log(f"stopped by signal {stop.signum} after step {stopped_at}/{self.total_steps}; checkpoint "
                     f"saved in {self.ckpt_dir}: run the same command again to resume")
            return {"stopped_at_step": stopped_at, "steps": self.total_steps}
        wall, tokens_seen = self._so_far()  # over every call of a resumed run
        export_dtype = getattr(torch, cfg.train.export_dtype)
        self.check_head_finite(f"the final head ({self.out / 'final'})", export_dtype)
        last_eval = self.evaluate() if self.is_main else {}
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None
        summary = {
            "steps": self.total_steps,
            "train_wall_s": round(wall, 1),
            "train_tokens_per_s": round(tokens_seen * self.world / max(wall, 1e-9), 1),
            "tokens": tokens_seen * self.world,
            "peak_gpu_mem_gib": round(peak, 2) if peak is not None else None,
            "world_size": self.world,
            "device": torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu",
            "nonfinite_steps_skipped": self.nonfinite_skipped,
            **last_eval,
        }
        self.save_checkpoint(self.total_steps)
        if self.is_main:
            metrics.log({"step": self.total_steps, **last_eval})
            meta = {"target": cfg.target.path or "smollm2-135m-instruct", "data": self.data.report, "train": summary,
                    "run_config": cfg.model_dump()}
            save_head(self.head, self.out / "final", export_dtype, meta, target_name=cfg.target.path or "smollm2-135m-instruct")
            metrics.finish(summary)
            self.log(f"final head -> {self.out / 'final'}")
        barrier(self.world)
        return summary


    def _loop(self, start: int, metrics, bar, stop: StopRequest) -> int | None:
        """Steps start..total_steps; returns the step it stopped after on a signal, else None."""
        cfg = self.cfg
        self._t_start = t_start = time.time()
        self._tokens_seen = 0
        for step in range(start, self.total_steps):
            step_stats = []
            for a in range(cfg.train.grad_accum):
                stats, n_tok = self.micro_step(self.batch_for(step * cfg.train.grad_accum + a))
                step_stats.append(stats)
                self._tokens_seen += n_tok
                if self.engine is not None:
                    self.engine.step()
            done = step + 1
            losses = torch.stack([s.loss.detach().float() for s in step_stats])
            if self.engine is None:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self.head.parameters(), cfg.train.max_grad_norm))
                finite = bool(torch.isfinite(losses).all()) and math.isfinite(grad_norm)
            else:  # DeepSpeed has stepped already; its own overflow check decides for fp16's loss scale
                grad_norm = float(self.engine.get_global_grad_norm() or 0.0)
                finite = bool(torch.isfinite(losses).all())
            bad_ranks = ranks_where(not finite, self.world, self.device)
            if bad_ranks:
                self.nonfinite_step(done, bad_ranks, losses, grad_norm)
                metrics.log({"step": done, "nonfinite_step_skipped": True,
                             "nonfinite_steps_skipped": self.nonfinite_skipped})
            elif self.engine is None:
                self.optimizer.step()
                self.scheduler.step()
            if self.engine is None:
                self.optimizer.zero_grad(set_to_none=True)
            if not bad_ranks and (done % cfg.train.log_every == 0 or done == self.total_steps or done == start + 1):
                # every rank logs at the same steps: average over ranks so curves compare across world sizes
                # the unroll's outputs: ttt_steps, or fewer for a kind of fixed depth (MTP modules, Medusa heads)
                k_steps = len(step_stats[0].step_correct)
                local = torch.tensor(
                    [sum(float(s.loss.detach()) for s in step_stats) / len(step_stats), sum(s.rows for s in step_stats)]
                    + [sum(float(s.step_correct[k]) for s in step_stats) for k in range(k_steps)]
                    + [sum(s.step_rows[k] for s in step_stats) for k in range(k_steps)],
                    dtype=torch.float64, device=self.device,
                )
                if self.world > 1:
                    torch.distributed.all_reduce(local)
                local = local.cpu()
                mean_loss, rows = float(local[0]) / self.world, int(local[1])
                acc = [float(local[2 + k]) / max(float(local[2 + k_steps + k]), 1.0) for k in range(k_steps)]
                elapsed = time.time() - t_start
                record = {
                    "step": done,
                    "loss": round(mean_loss, 5),
                    "acc": [round(x, 4) for x in acc],
                    "lr": self.scheduler.get_last_lr()[0],
                    "grad_norm": round(grad_norm, 4),
                    "rows": rows,
                    "tokens_per_s": round(self._tokens_seen * self.world / max(elapsed, 1e-9), 1),
                    "elapsed_s": round(elapsed, 1),
                }
                metrics.log(record)
                bar.set_postfix(loss=record["loss"], acc0=record["acc"][0], lr=f"{record['lr']:.2e}")
            if done % cfg.train.eval_every == 0 and done != self.total_steps:
                last_eval = self.evaluate() if self.is_main else {}
                metrics.log({"step": done, **last_eval})
                barrier(self.world)
            if done % cfg.train.save_every == 0 and done != self.total_steps:
                self.save_checkpoint(done)
            bar.update(1)
            if done != self.total_steps and stop.agreed(self.world, self.device):
                return done
        return None

    def nonfinite_step(self, done: int, bad_ranks: list[int], losses: torch.Tensor, grad_norm: float) -> None:
        """A step whose loss or gradient norm is NaN/Inf on any rank: a TrainingError on every rank,
        or, under train.skip_nonfinite, no update (counted). Every rank gets the same bad_ranks."""
        where = f"rank {bad_ranks}" if self.world > 1 else "this process"
        detail = (f"step {done}/{self.total_steps}: the loss or the gradient norm is not finite on {where} "
                  f"(here: loss {[round(x, 4) for x in losses.tolist()]}, gradient norm {grad_norm:.4g})")
        if not self.cfg.train.skip_nonfinite:
            resume = (f"; the last intact checkpoint is {self.last_checkpoint}, which the same command resumes from"
                      if self.last_checkpoint else "")
            raise TrainingError(
                f"{detail}. Training stopped, nothing of this step was saved{resume}. Lower train.lr or "
                f"train.max_grad_norm, check the data, or set train.skip_nonfinite=true to skip such steps"
            )
        if self.engine is not None and self.engine.was_step_applied():
            raise TrainingError(
                f"{detail}, and DeepSpeed applied the update anyway, so the weights cannot be trusted: enable its "
                f"overflow check (bf16.check_grad_overflow: true in {self.cfg.train.deepspeed}) for "
                f"train.skip_nonfinite to work"
            )
        self.nonfinite_skipped += 1
        self.warn(f"{detail}: skipped without an update (train.skip_nonfinite); "
                  f"{self.nonfinite_skipped} step(s) skipped so far")


def train(cfg: RunConfig) -> dict:
    return Trainer(cfg).run()


def _shape_options_of(head_cfg) -> list[str]:
    """The run config's head.* shape options a head's config takes (its own list where it names one)."""
    own = getattr(head_cfg, "SHAPE_OPTIONS", None)
    return [n for n in SHAPE_OPTIONS if (n in own if own is not None else hasattr(head_cfg, n))]


def evaluate_head(head_dir: str, data_dir: str, target: str | None = None, rows: int = 256, batch_size: int = 8,
                  ttt_steps: int = 7) -> dict:
    """A trained head's held-out figures (the training report's eval/* keys) on a prepared
    folder's eval split, without training: the same evaluation a run ends with."""
    from specheads.config import load_config
    from specheads.heads.format import load_head

    head = load_head(head_dir)
    cfg = load_config(None, ["train.deepspeed=null", f"train.ttt_steps={ttt_steps}"], **{
        "head.kind": head.kind, "data.path": data_dir, "data.eval_max_rows": rows, "train.batch_size": batch_size,
        "target.layer_ids": list(head.config.target_layer_ids), "output_dir": str(Path(head_dir) / ".eval"),
        **{f"head.{name}": getattr(head.config, name) for name in _shape_options_of(head.config)},
        **({"target.path": target} if target else {})})
    t = Trainer(cfg)
    t.setup()
    if t.head.config.draft_vocab_size != head.config.draft_vocab_size or \
            t.head.config.hidden_size != head.config.hidden_size:
        raise TrainingError(f"head {head_dir!r} (hidden {head.config.hidden_size}, draft vocab "
                            f"{head.config.draft_vocab_size}) does not fit target {str(t.target_dir)!r} with data "
                            f"{data_dir!r} (hidden {t.head.config.hidden_size}, draft vocab {t.head.config.draft_vocab_size})")
    # the head's own weights and vocab map, in the training precision
    t.head.load_state_dict({k: v.to(torch.float32) if v.is_floating_point() else v
                            for k, v in head.state_dict().items()})
    t.teacher_weight = t.target.lm_head.weight[t.head.target_rows()].detach()
    return t.evaluate()
