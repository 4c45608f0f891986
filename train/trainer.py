"""The trainer: one GRPO-family update on a batch of samples, for LoRA (peft) or full fine-tuning of any HF
causal LM, on the CPU or a GPU (bf16 weights, fp32 optimizer state, loss and logprobs), one process or a torchrun
job (FSDP2); micro-batches by count or token budget with gradient accumulation, PPO epochs × mini-batches of
optimizer steps per batch; saves HF / peft checkpoints for publishing."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hrl.config import TrainerConfig
from hrl.runners.errors import PrerequisiteError
from hrl.runners.models import resolve_model
from hrl.train import distributed
from hrl.train.device import (
    MasterWeights,
    peak_mem_gib,
    plan_micro_batches,
    reset_peak_mem,
    resolve_device,
    resolve_dtype,
    split_mini_batches,
)
from hrl.train.loss import importance_weights, kl_to_reference, mismatch_kl, policy_loss
from hrl.train.media import MediaError, Pixels
from hrl.train.offload import Offloader, OffloadPlan, free_cache, optimizer_tensors
from hrl.train.policy import LogprobModel, build_policy
from hrl.train.samples import Sample
from hrl.train.tree import token_ratio, tree_declined_for_media, tree_plan

__all__ = ["Trainer", "TrainerConfig", "token_weights"]


class Trainer:
    def __init__(self, config: TrainerConfig) -> None:
        self.config = config
        torch.manual_seed(config.seed)
        self.path = resolve_model(config.model)
        local_rank = int(__import__("os").environ.get("LOCAL_RANK", "0"))
        try:
            self.device = resolve_device(config.device, local_rank, config.gpus)
        except RuntimeError as e:  # asked for CUDA on a machine (or torch build) without it
            raise PrerequisiteError(
                str(e), hint="use -c trainer.device=auto (the CPU here), or a CUDA build of torch"
            ) from e
        self.distributed = distributed.init_from_env(self.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        build = functools.partial(build_policy, config, self.path, self.device, self.dtype, self.distributed)
        with distributed.on_device(self.device):  # this thread's; steps may run in others (each enters it again)
            self.model, self.forward = build()
            # full fine-tuning with a KL term: a frozen copy of the starting weights, sharded as the policy is
            self.reference = build(trainable=False)[1] if config.kl_coef > 0 and config.mode == "full" else None
        # a vision model's images: pixel inputs made from media/ (`hrl.train.media`), per sample, once per step
        self.takes_images = getattr(self.model.config, "vision_config", None) is not None
        self.media_dir: Path | None = None  # where the loops' traces keep their images' bytes (start_trainer sets it)
        self._pixels = Pixels(self.path)
        self._pixel_cache: dict[tuple[str, tuple[str, ...]], dict[str, torch.Tensor]] = {}
        params = self._trainable()
        self.n_trainable = sum(p.numel() for p in params)
        adamw = {"lr": config.lr, "weight_decay": config.weight_decay}
        low = any(p.dtype != torch.float32 for p in params)
        self.optimizer = MasterWeights(params, **adamw) if low else torch.optim.AdamW(params, **adamw)
        self.steps = 0

    # ---- forward helpers -------------------------------------------------------------------------------------
    def _pad(self, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s.input_ids) for s in samples)
        ids = torch.zeros((len(samples), width), dtype=torch.long)  # (B, T) right-padded
        mask = torch.zeros((len(samples), width), dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
            mask[i, : len(s.input_ids)] = 1
        return ids.to(self.device), mask.to(self.device)

    def _gather(self, samples: list[Sample], logp: torch.Tensor) -> torch.Tensor:
        """Flatten the loss tokens of a micro-batch: logp is (B, T-1), predicting tokens 1..T-1."""
        return torch.cat(
            [logp[i][torch.tensor(_loss_pos(s), device=logp[i].device) - 1] for i, s in enumerate(samples)]
        )

    def _logp(self, model: LogprobModel, mb: list[Sample], tree: bool) -> torch.Tensor | list[torch.Tensor]:
        """A micro-batch's logprobs, [i][t] predicting sample i's token t+1: one packed prefix tree, or padded rows
        (a sample with images is a micro-batch of its own, with its pixel inputs)."""
        if tree:
            return model(None, None, [s.input_ids for s in mb])
        return model(*self._pad(mb), pixels=self._pixel_inputs(mb[0]) if mb[0].media else None)

    def _pixel_inputs(self, sample: Sample) -> dict[str, torch.Tensor]:
        """A sample's pixel inputs on the trainer's device, floats in its dtype; made once per step."""
        if not self.takes_images:
            raise MediaError(f"trace {sample.trace_id} holds images, and {self.config.model} has no vision tower")
        key = (sample.trace_id, tuple(sample.branch))
        if key not in self._pixel_cache:
            made = self._pixels.of(sample)
            self._pixel_cache[key] = {k: v.to(device=self.device, dtype=self.dtype if v.is_floating_point() else v.dtype)
                                      for k, v in made.items()}  # fmt: skip
        return self._pixel_cache[key]

    @distributed.on_own_device
    @torch.no_grad()
    def logprobs(self, samples: list[Sample], reference: bool = False) -> list[torch.Tensor]:
        """The trainer's logprobs of each sample's loss tokens under the current weights (eval mode), or under the
        reference weights (the starting point) with `reference`: LoRA's base, or full mode's frozen copy. fp32, on
        the CPU. Every rank of a sharded trainer computes all of them (the same forwards on every rank)."""
        self.onload()  # what rollouts had offloaded comes back first (nothing to do otherwise)
        model, ctx = self.forward, contextlib.nullcontext()
        if reference and self.config.mode == "lora":
            ctx = self.model.disable_adapter()
        elif reference:
            if self.reference is None:
                raise ValueError("full fine-tuning keeps reference weights only when kl_coef > 0")
            model = self.reference
        self.model.eval()
        out: list[torch.Tensor] = [torch.empty(0)] * len(samples)
        plan, tree = self._plan(samples)
        with ctx:
            for mb in plan:
                lp = self._logp(model, [samples[i] for i in mb], tree)
                for j, i in enumerate(mb):
                    out[i] = lp[j][torch.tensor(_loss_pos(samples[i]), device=lp[j].device) - 1].float().cpu()
        self.model.train()
        return out

    def _plan(self, samples: list[Sample]) -> tuple[list[list[int]], bool]:
        """Micro-batches (sample indices) and whether each is one packed prefix tree (trainer.tree) or padded rows.
        A batch with images trains one row per branch (`tree_declined_for_media`), each sample with images alone."""
        cfg, seqs = self.config, [s.input_ids for s in samples]
        images = [i for i, s in enumerate(samples) if s.media]
        if images:
            tree_declined_for_media(cfg.tree)
            text = [i for i, s in enumerate(samples) if not s.media]
            plan = plan_micro_batches([len(seqs[i]) for i in text], cfg.micro_batch, cfg.micro_batch_tokens)
            return [[text[j] for j in mb] for mb in plan] + [[i] for i in images], False
        trees = tree_plan(self.model, seqs, cfg.tree, cfg.tree_threshold, cfg.tree_max_tokens)
        if trees is not None:
            return trees, True
        return plan_micro_batches([len(s) for s in seqs], cfg.micro_batch, cfg.micro_batch_tokens), False

    # ---- the update ----------------------------------------------------------------------------------------
    @distributed.on_own_device
    def step(self, samples: list[Sample], ppo_epochs: int = 1, mini_batches: int = 1) -> dict[str, float]:
        """`ppo_epochs` passes over the batch, each split into `mini_batches` optimizer steps (whole traces, shuffled
        per epoch when there are several steps), each with gradient accumulation over its micro-batches; the old
        logprobs are taken once, before the first, so from the second step on the ratio moves and clipping acts.
        No step when every advantage is zero (`train/skipped` = 1). Per-step metrics are averaged (`_max`: max)."""
        cfg, t0 = self.config, time.monotonic()
        reset_peak_mem(self.device)
        self._pixel_cache.clear()
        samples = [s for s in samples if s.loss_tokens > 0]
        if not samples:
            return {"train/samples": 0.0}
        n_traces = len({s.trace_id for s in samples})
        proximal = self.logprobs(samples)  # trainer's policy at update start, per sample
        behaviour = [_flat([s], lambda x: x.behaviour_logprobs) for s in samples]
        metrics = mismatch_kl(torch.cat(proximal), torch.cat(behaviour))
        if not any(a for s in samples for a in s.token_advantages()):
            # no learning signal (every group agreed): the gradient is exactly zero, but Adam would still move every
            # weight by its momentum (m/√v ≠ 0), drifting a policy that just collapsed further from where it was
            return {**metrics, "train/loss": 0.0, "train/grad_norm": 0.0, "train/samples": float(len(samples)),
                    "train/traces": float(n_traces), "train/skipped": 1.0, "train/update_norm": 0.0,
                    "train/step_s": time.monotonic() - t0}  # fmt: skip
        ref = self.logprobs(samples, reference=True) if cfg.kl_coef > 0 else None
        steps = []
        for epoch in range(ppo_epochs):
            for part in split_mini_batches(
                samples, mini_batches, ppo_epochs * mini_batches > 1, cfg.seed, self.steps, epoch
            ):
                steps.append(self._optimizer_step([samples[i] for i in part], [proximal[i] for i in part],
                                                  [behaviour[i] for i in part], ref and [ref[i] for i in part],
                                                  first=not steps))  # fmt: skip
        for k in {k for m in steps for k in m}:
            values = [m[k] for m in steps if k in m]
            metrics[k] = max(values) if k.endswith("_max") else sum(values) / len(values)
        metrics.update(
            {
                "train/samples": float(len(samples)),
                "train/traces": float(n_traces),
                "train/loss_tokens": float(sum(s.loss_tokens for s in samples)),
                "train/tree": float(self._plan(samples)[1]),
                "train/tree_token_ratio": token_ratio([s.input_ids for s in samples]),
                "train/optimizer_steps": float(len(steps)),
                "train/skipped": 0.0,
                "train/peak_mem_gib": peak_mem_gib(self.device),
                "train/step_s": time.monotonic() - t0,
            }
        )
        return metrics

    def _optimizer_step(
        self, samples: list[Sample], proximal: list[torch.Tensor], behaviour: list[torch.Tensor],
        ref: list[torch.Tensor] | None, first: bool = True,
    ) -> dict[str, float]:  # fmt: skip
        """One optimizer step on a mini-batch: its loss is normalised over its own traces. Rank r of a sharded trainer
        runs micro-batches r, r + world, … and a rank short of one runs a zero-weighted one (FSDP2 needs every rank
        to run the same forwards)."""
        cfg, dev = self.config, self.device
        rank, world = distributed.world()
        n_traces = len({s.trace_id for s in samples})
        plan, tree = self._plan(samples)
        mine = plan[rank::world]
        mine += [plan[0]] * (-(-len(plan) // world) - len(mine))  # padding: the weight of these is 0
        self.optimizer.zero_grad(set_to_none=True)
        total, kl_total, parts = 0.0, 0.0, []
        for k, mb_idx in enumerate(mine):
            scale = 0.0 if k >= len(plan[rank::world]) else 1.0
            mb = [samples[i] for i in mb_idx]
            logp = self._gather(mb, self._logp(self.forward, mb, tree)).float()  # (N,)
            prox = torch.cat([proximal[i] for i in mb_idx]).to(dev)
            behav = torch.cat([behaviour[i] for i in mb_idx]).to(dev)
            adv = torch.cat([torch.tensor(s.token_advantages())[_loss_pos(s)] for s in mb]).to(dev)  # (N,)
            weight = token_weights(mb, n_traces, cfg.loss_norm, cfg.max_len).to(dev) * scale
            old, is_w = (behav, None) if cfg.correction == "none" else (prox, None)
            if cfg.correction != "none":  # ratio against the trainer, importance weight against the engine
                is_w, m = importance_weights(prox, behav, cfg.tis_cap if cfg.correction == "tis" else None)
                parts.append((m, scale))
            loss, m = policy_loss(logp, old, adv, weight, cfg.clip_low, cfg.clip_high, is_w)
            if ref is not None:
                kl, _ = kl_to_reference(logp, torch.cat([ref[i] for i in mb_idx]).to(dev), weight)
                loss = loss + cfg.kl_coef * kl
                kl_total += float(kl.detach())
            (loss * world).backward()  # the ranks' gradients are averaged: × world makes it their sum
            total += float(loss.detach())
            parts.append((m, scale))
        grad_norm = self._clip()
        before = [p.detach().clone() for p in self._masters()] if cfg.max_update_kl > 0 else None
        start = proximal if before is None or first else self.logprobs(samples)  # the trust region's origin
        stepped = {id(m) for m in self._masters() if m.grad is not None}  # AdamW skips a weight without a grad
        self.optimizer.step()
        self.steps += 1
        whole = self._update_norm(stepped)  # AdamW's own step, before the trust region may scale it
        metrics = self._trust_region(samples, start, before) if before is not None else {}  # the same on every rank
        metrics["train/update_norm"] = whole * metrics.get("train/update_scale", 1.0)
        # micro-batch metrics: means over the real micro-batches of all ranks (every micro-batch, padding included,
        # yields the same keys, so each rank reduces the same list), maxima over them
        keys = sorted({k for m, _ in parts for k in m})
        sums = [sum(m[k] * w for m, w in parts if k in m) for k in keys]
        maxima = [max((m[k] for m, w in parts if w and k in m), default=0.0) for k in keys]
        counts = [sum(w for m, w in parts if k in m) for k in keys]
        sums, counts = distributed.all_reduce(sums, dev), distributed.all_reduce(counts, dev)
        maxima = distributed.all_reduce(maxima, dev, "max")
        total, kl_total = distributed.all_reduce([total, kl_total], dev)
        for k, v, n, mx in zip(keys, sums, counts, maxima, strict=True):
            metrics[k] = mx if k.endswith("_max") else v / max(n, 1.0)
        metrics |= {"train/loss": total, "train/grad_norm": grad_norm}
        return metrics | ({"train/kl_ref": kl_total} if ref is not None else {})

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The full model's weights under their HF names, where they live (tied ones once): full mode, one process."""
        if self.config.mode != "full" or self.distributed:
            raise ValueError("named_weights needs full fine-tuning in one trainer process")
        return list(self.model.named_parameters())

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _masters(self) -> list[torch.Tensor]:
        """Where the optimizer keeps the weights it updates: the fp32 masters under MasterWeights (the model holds
        their rounded copies), else the trainable parameters themselves."""
        return self.optimizer.masters if isinstance(self.optimizer, MasterWeights) else self._trainable()

    @torch.no_grad()
    def _update_norm(self, stepped: set[int]) -> float:
        """The norm of the update the last AdamW step applied to the master weights (`stepped`: the ids of those it
        moved), from the optimizer's own state, no copy of the weights kept: p_new = p_old (1 - lr wd) - lr m̂ / (√v̂ +
        eps)."""

        def local(x: torch.Tensor) -> torch.Tensor:  # a sharded (FSDP2) weight's own shard
            return x.to_local() if hasattr(x, "to_local") else x

        inner = self.optimizer.optimizer if isinstance(self.optimizer, MasterWeights) else self.optimizer
        sums = [0.0, 0.0]  # of sharded weights (each rank holds a part: summed over ranks), of whole ones
        for group in inner.param_groups:
            lr, wd, eps, (b1, b2) = group["lr"], group["weight_decay"], group["eps"], group["betas"]
            for p in group["params"]:
                state = inner.state.get(p)
                if id(p) not in stepped or not state or "exp_avg" not in state:
                    continue
                t = float(state["step"])
                m, v = local(state["exp_avg"]).float(), local(state["exp_avg_sq"]).float()
                new = local(p.detach()).float()
                old = (new + lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + eps)) / (1 - lr * wd)
                sums[0 if hasattr(p, "to_local") else 1] += float((new - old).double().pow(2).sum())
        sharded = distributed.all_reduce([sums[0]], self.device)[0]
        return (sharded + sums[1]) ** 0.5

    @torch.no_grad()
    def _trust_region(
        self, samples: list[Sample], proximal: list[torch.Tensor], before: list[torch.Tensor]
    ) -> dict[str, float]:
        """Backtrack a step that moved the policy too far: one update with a big KL on its own batch is how a small
        policy loses its tool-call format at once. The optimizer's moments keep the step's gradient."""
        old, bound = torch.cat(proximal), self.config.max_update_kl
        masters = self._masters()  # `before` is theirs: the step is scaled in fp32, never read back from bf16
        deltas = [m.detach() - b for m, b in zip(masters, before, strict=True)]

        def place(scale: float) -> None:
            for m, b, d in zip(masters, before, deltas, strict=True):
                m.copy_(b + scale * d if scale else b)
            if isinstance(self.optimizer, MasterWeights):  # the model computes with the masters' rounded values
                self.optimizer.sync_to_model()

        scale, kl = 1.0, _update_kl(old, torch.cat(self.logprobs(samples)))
        first = kl
        while kl > bound and scale > 1 / 8:
            scale /= 2
            place(scale)
            kl = _update_kl(old, torch.cat(self.logprobs(samples)))
        if kl > bound:
            scale, kl = 0.0, 0.0
            place(0.0)
        # a step left whole (scale 1) touches nothing: the masters keep the fp32 update exactly as AdamW made it
        return {"train/update_kl": kl, "train/update_kl_full_step": first, "train/update_scale": scale}

    def _clip(self) -> float:
        """Clip the batch's gradient where it accumulated: the fp32 masters' under MasterWeights, else the model's."""
        holders = self.optimizer.masters if isinstance(self.optimizer, MasterWeights) else self.model.parameters()
        params = [p for p in holders if p.grad is not None]
        if self.config.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm)
        else:
            norm = torch.norm(torch.stack([p.grad.detach().norm() for p in params])) if params else torch.zeros(())
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # a DTensor when sharded

    # ---- colocated layout: what the trainer keeps while the engine serves --------------------------------------
    @functools.cached_property
    def _offloader(self) -> Offloader:
        return Offloader("cpu")

    def offload(self, plan: OffloadPlan = "none") -> dict[str, float]:
        """Before the engine wakes: drop the grads (every step starts without), move what `plan` names to (pinned)
        host memory (optimizer: AdamW moments and fp32 masters; all: the weights too, the reference copy's among
        them) and hand the allocator's cache back to the driver. `offload/gib` is what moved."""
        self.optimizer.zero_grad(set_to_none=True)
        tensors = optimizer_tensors(self.optimizer) if plan != "none" else []
        if plan == "all":
            tensors += [*self.model.parameters(), *(self.reference.parameters() if self.reference else [])]
        t0 = time.monotonic()
        moved = self._offloader.offload(tensors)
        free_cache(self.device)
        return {"offload/gib": moved / 2**30, "offload/seconds": time.monotonic() - t0} if plan != "none" else {}

    def onload(self) -> None:
        """Everything offload moved, back on the trainer's device for the update."""
        if self._offloader.away:
            self._offloader.onload()

    # ---- checkpoints ---------------------------------------------------------------------------------------
    @distributed.on_own_device
    def save(self, out_dir: str | Path) -> Path:
        """Write a peft adapter (lora) or a full HF checkpoint with tokenizer files (full). Sharded: every rank
        gathers, rank 0 writes the same files; each rank writes its own optimizer shard."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if self.distributed:
            tied = self.model.all_tied_weights_keys or {}  # e.g. lm_head = embed_tokens: saved once
            state = {k.removeprefix("inner."): v for k, v in distributed.full_state_dict(self.forward).items()}
            state = {k: v for k, v in state.items() if k not in tied}
            if self.config.mode == "full":  # bf16 training keeps fp32 shards: the checkpoint is in the model's dtype
                state = {k: v.to(self.dtype) if v.is_floating_point() else v for k, v in state.items()}
            if distributed.is_main():
                self.model.save_pretrained(out, safe_serialization=True, state_dict=state)
        else:
            self.model.save_pretrained(out, safe_serialization=True)
        self.save_optimizer(out)
        if self.config.mode == "full" and distributed.is_main():
            import shutil

            for f in Path(self.path).iterdir() if Path(self.path).is_dir() else []:
                if f.name.startswith(("tokenizer", "chat_template", "special_tokens", "vocab", "merges",
                                      "preprocessor_config", "processor_config")):  # fmt: skip
                    shutil.copy(f, out / f.name)
        if self.distributed:
            torch.distributed.barrier()
        return out

    def _optimizer_file(self, ckpt: Path) -> Path:
        rank, world = distributed.world()
        return ckpt / ("optimizer.pt" if world == 1 else f"optimizer-rank{rank}-of-{world}.pt")

    def save_optimizer(self, out_dir: str | Path) -> None:
        state = {"optimizer": self.optimizer.state_dict(), "steps": self.steps}
        torch.save(state, self._optimizer_file(Path(out_dir)))

    @distributed.on_own_device
    def load(self, checkpoint: str | Path) -> None:
        """Restore weights (adapter or full) and optimizer state saved by save() + save_optimizer() (a sharded
        trainer's optimizer shards need the same number of ranks)."""
        from safetensors.torch import load_file

        self.onload()  # the optimizer's state loads onto its masters' device: the trainer's, not the host
        ckpt = Path(checkpoint)
        state = {}
        for f in sorted(ckpt.glob("adapter_model.safetensors" if self.config.mode == "lora" else "*.safetensors")):
            state.update(load_file(f))
        if self.config.mode == "lora":  # peft drops the adapter name from the saved keys
            state = {k: state[k.replace(".default.", ".")] for k in self.model.state_dict() if "lora_" in k}
        if self.distributed:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            opts = StateDictOptions(full_state_dict=True, strict=False)
            set_model_state_dict(self.forward, {f"inner.{k}": v for k, v in state.items()}, options=opts)
        else:
            self.model.load_state_dict(state, strict=False)
        if isinstance(self.optimizer, MasterWeights):
            self.optimizer.sync_from_model()  # masters follow the loaded weights
        opt = self._optimizer_file(ckpt)
        if opt.is_file():
            saved = torch.load(opt, weights_only=not self.distributed)  # shards hold DTensors
            self.optimizer.load_state_dict(saved["optimizer"])
            self.steps = int(saved["steps"])

    def lr_info(self) -> dict[str, float]:
        """`train/lr`, the optimizer's learning rate now, and `train/trainable_params`: logged with every step."""
        return {"train/lr": self.optimizer.param_groups[0]["lr"], "train/trainable_params": float(self.n_trainable)}

    def close(self) -> None:
        """Nothing to stop in one process (a `TrainerGroup` stops its other ranks): the loops close either."""


def token_weights(samples: list[Sample], n_traces: int, loss_norm: str, max_len: int) -> torch.Tensor:
    """Each loss token's weight in the loss, (N,) over the samples' loss tokens in order. trace: the sample's
    per-trace token-mean weight ÷ traces (Σ = 1 over a whole batch). constant (Dr. GRPO): 1 / (max_len × traces)
    for every token, so a long trace weighs more than a short one and no trace's length rescales its tokens."""
    if loss_norm == "constant":
        return torch.cat([torch.full((len(_loss_pos(s)),), 1.0 / (max_len * n_traces)) for s in samples])
    return _flat(samples, lambda s: s.weight) / n_traces


def _flat(samples: list[Sample], values: Callable[[Sample], list[float]]) -> torch.Tensor:
    """A per-position list of the samples (`values`: its weights, its behaviour logprobs), at their loss tokens
    only: (N,)."""
    return torch.tensor([values(s)[p] for s in samples for p in _loss_pos(s)], dtype=torch.float32)


def _loss_pos(s: Sample) -> list[int]:
    """Indices of loss tokens in a sample (never 0: the first token has no prediction)."""
    return [i for i, m in enumerate(s.loss_mask) if m and i > 0]


def _update_kl(old: torch.Tensor, new: torch.Tensor) -> float:
    """Mean k3 KL(π_old || π_new) on tokens sampled from π_old: the estimator the mismatch metric uses."""
    return float(mismatch_kl(new, old)["train/mismatch_kl"])
