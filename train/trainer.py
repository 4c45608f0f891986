"""The trainer: one GRPO-family update on a batch of samples, for LoRA (peft) or full fine-tuning of any HF
causal LM, with micro-batching and gradient accumulation; saves HF / peft checkpoints for publishing."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Literal

import torch
from pydantic import BaseModel, Field

from hrl.runners.models import resolve_model
from hrl.train.logprobs import token_logprobs
from hrl.train.loss import importance_weights, kl_to_reference, mismatch_kl, policy_loss
from hrl.train.samples import Sample
from hrl.train.tree import Batches, batches, tree_logprobs

__all__ = ["Trainer", "TrainerConfig", "token_weights"]

_ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TrainerConfig(BaseModel):
    model: str = Field(description="HF model id or local dir to train.")
    mode: Literal["lora", "full"] = Field("lora", description="LoRA adapters (peft) or all weights.")
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_targets: list[str] = Field(default_factory=lambda: list(_ALL_PROJ))
    lr: float = Field(1e-5, description="AdamW learning rate.")
    weight_decay: float = 0.0
    max_grad_norm: float = Field(1.0, description="Global grad-norm clip; 0 = off.")
    micro_batch: int = Field(4, description="Samples per forward/backward (gradient accumulation over the rest).")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="Weights and compute dtype.")
    logprob_chunk: int = Field(512, description="Positions per vocabulary-projection chunk.")
    tree: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Prefix-shared training: the batch's branches packed into one token tree per forward pass, each "
        "shared prefix computed once (same logprobs and gradients). auto: when distinct ÷ total tokens < tree_threshold.",
    )
    tree_threshold: float = Field(0.75, description="tree=auto packs trees below this distinct ÷ total tokens.")
    tree_max_tokens: int = Field(16384, description="Distinct tokens per tree forward pass (the tree's micro-batch).")
    clip_low: float = Field(0.2, description="PPO clip below 1 (ε_low).")
    clip_high: float = Field(0.2, description="PPO clip above 1 (ε_high); > clip_low is DAPO clip-higher.")
    correction: Literal["tis", "decoupled", "none"] = Field(
        "tis",
        description="none: ratio against the recorded behaviour logprobs. tis: ratio against the trainer's logprobs "
        "at update start, × min(π_prox/π_behav, tis_cap). decoupled: the same, untruncated (decoupled PPO).",
    )
    tis_cap: float = Field(2.0, description="Truncation of the importance weight for 'tis'.")
    loss_norm: Literal["trace", "constant"] = Field(
        "trace",
        description="trace: token mean within each trace, mean over traces. constant: Dr. GRPO (Liu et al. 2025): "
        "every token counts the same, loss summed ÷ (max_len × traces). `train.advantage: dr_grpo` sets constant.",
    )
    max_len: int = Field(4096, description="The constant normaliser of loss_norm=constant (Dr. GRPO), in tokens.")
    kl_coef: float = Field(
        0.0,
        description="Weight of a k3 KL(π || π_ref) penalty on the sampled tokens, π_ref = the starting weights "
        "(LoRA: the base with adapters off; full: a frozen copy). 0 = off.",
    )
    max_update_kl: float = Field(
        0.0,
        description="Trust region per step: when the step moves the policy by more than this mean k3 KL on the "
        "batch's own tokens, the step is scaled back (1/2, 1/4, 1/8, else undone). Keeps one copy of the trainable "
        "weights. 0 = off.",
    )
    seed: int = 0


class Trainer:
    def __init__(self, config: TrainerConfig) -> None:
        from transformers import AutoModelForCausalLM

        self.config = config
        torch.manual_seed(config.seed)
        self.path = resolve_model(config.model)
        dtype = getattr(torch, config.dtype)
        model = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype)
        model.config.use_cache = False
        if config.mode == "lora":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, target_modules=config.lora_targets)
            model = get_peft_model(model, lora)
        self.model = model.train()
        self.reference = None  # full fine-tuning with a KL term: a frozen copy of the starting weights
        if config.kl_coef > 0 and config.mode == "full":
            self.reference = AutoModelForCausalLM.from_pretrained(self.path, dtype=dtype).eval().requires_grad_(False)
        params = self._trainable()
        self.n_trainable = sum(p.numel() for p in params)
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
        self.steps = 0

    # ---- forward helpers -------------------------------------------------------------------------------------
    def _pad(self, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s.input_ids) for s in samples)
        ids = torch.zeros((len(samples), width), dtype=torch.long)  # (B, T) right-padded
        mask = torch.zeros((len(samples), width), dtype=torch.long)
        for i, s in enumerate(samples):
            ids[i, : len(s.input_ids)] = torch.tensor(s.input_ids)
            mask[i, : len(s.input_ids)] = 1
        return ids, mask

    def _gather(self, samples: list[Sample], logp: torch.Tensor) -> torch.Tensor:
        """Flatten the loss tokens of a micro-batch: logp[i] is sample i's (T-1,), predicting tokens 1..T-1."""
        return torch.cat([logp[i][torch.tensor(_loss_pos(s)) - 1] for i, s in enumerate(samples)])

    def _batches(self, samples: list[Sample]) -> Batches:
        cfg = self.config
        seqs = [s.input_ids for s in samples]
        return batches(self.model, seqs, cfg.tree, cfg.tree_threshold, cfg.micro_batch, cfg.tree_max_tokens)

    def _forward(self, model: torch.nn.Module, mb: list[Sample], tree: bool) -> list[torch.Tensor] | torch.Tensor:
        """Per-sample logprobs of a forward pass, [i][t] predicting token t+1: one packed tree, or padded rows."""
        if tree:
            return [lp.float() for lp in tree_logprobs(model, [s.input_ids for s in mb], self.config.logprob_chunk)]
        ids, mask = self._pad(mb)
        return token_logprobs(model, ids, mask, self.config.logprob_chunk).float()

    @torch.no_grad()
    def logprobs(self, samples: list[Sample], reference: bool = False) -> list[torch.Tensor]:
        """The trainer's logprobs of each sample's loss tokens under the current weights (eval mode), or under the
        reference weights (the starting point) with `reference`: LoRA's base, or full mode's frozen copy."""
        model, ctx = self.model, contextlib.nullcontext()
        if reference and self.config.mode == "lora":
            ctx = self.model.disable_adapter()
        elif reference:
            if self.reference is None:
                raise ValueError("full fine-tuning keeps reference weights only when kl_coef > 0")
            model = self.reference
        self.model.eval()
        out: list[torch.Tensor] = [torch.empty(0)] * len(samples)
        plan = self._batches(samples)
        with ctx:
            for i, j in plan.spans:
                mb = [samples[k] for k in plan.order[i:j]]
                lp = self._forward(model, mb, plan.tree)
                for m, k in enumerate(plan.order[i:j]):
                    out[k] = lp[m][torch.tensor(_loss_pos(samples[k])) - 1]
        self.model.train()
        return out

    # ---- the update ----------------------------------------------------------------------------------------
    def step(self, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step over all samples (gradient accumulation across micro-batches); none when every advantage
        is zero (`train/skipped` = 1)."""
        cfg, t0 = self.config, time.monotonic()
        samples = [s for s in samples if s.loss_tokens > 0]
        if not samples:
            return {"train/samples": 0.0}
        plan = self._batches(samples)
        samples = [samples[k] for k in plan.order]  # shared prefixes side by side; spans are then contiguous
        n_traces = len({s.trace_id for s in samples})
        proximal = self.logprobs(samples)  # trainer's policy at update start, per sample
        behaviour = [_flat([s], "behaviour_logprobs") for s in samples]
        metrics = mismatch_kl(torch.cat(proximal), torch.cat(behaviour))
        if all(s.advantage == 0 for s in samples):
            # no learning signal (every group agreed): the gradient is exactly zero, but Adam would still move every
            # weight by its momentum (m/√v ≠ 0), drifting a policy that just collapsed further from where it was
            return {**metrics, "train/loss": 0.0, "train/grad_norm": 0.0, "train/samples": float(len(samples)),
                    "train/traces": float(n_traces), "train/skipped": 1.0, "train/step_s": time.monotonic() - t0}  # fmt: skip
        ref = self.logprobs(samples, reference=True) if cfg.kl_coef > 0 else None
        self.optimizer.zero_grad(set_to_none=True)
        total, kl_total, parts = 0.0, 0.0, []
        for i, j in plan.spans:
            mb = samples[i:j]
            logp = self._gather(mb, self._forward(self.model, mb, plan.tree))  # (N,)
            prox = torch.cat(proximal[i:j])
            behav = torch.cat(behaviour[i:j])
            adv = torch.cat([torch.full((len(_loss_pos(s)),), s.advantage) for s in mb])
            weight = token_weights(mb, n_traces, cfg.loss_norm, cfg.max_len)
            old, is_w = (behav, None) if cfg.correction == "none" else (prox, None)
            if cfg.correction != "none":  # ratio against the trainer, importance weight against the engine
                is_w, m = importance_weights(prox, behav, cfg.tis_cap if cfg.correction == "tis" else None)
                parts.append(m)
            loss, m = policy_loss(logp, old, adv, weight, cfg.clip_low, cfg.clip_high, is_w)
            if ref is not None:
                kl, _ = kl_to_reference(logp, torch.cat(ref[i:j]), weight)
                loss = loss + cfg.kl_coef * kl
                kl_total += float(kl.detach())
            loss.backward()
            total += float(loss.detach())
            parts.append(m)
        grad_norm = self._clip()
        before = [p.detach().clone() for p in self._trainable()] if cfg.max_update_kl > 0 else None
        self.optimizer.step()
        self.steps += 1
        if before is not None:
            metrics |= self._trust_region(samples, proximal, before)
        for m in parts:
            for k, v in m.items():
                metrics[k] = metrics.get(k, 0.0) + v / max(1, sum(1 for p in parts if k in p))
        metrics.update(
            {
                "train/loss": total,
                "train/grad_norm": grad_norm,
                "train/samples": float(len(samples)),
                "train/traces": float(n_traces),
                "train/loss_tokens": float(sum(s.loss_tokens for s in samples)),
                "train/tree": float(plan.tree),
                "train/tree_token_ratio": plan.token_ratio,
                "train/skipped": 0.0,
                **({"train/kl_ref": kl_total} if ref is not None else {}),
                "train/step_s": time.monotonic() - t0,
            }
        )
        return metrics

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    @torch.no_grad()
    def _trust_region(
        self, samples: list[Sample], proximal: list[torch.Tensor], before: list[torch.Tensor]
    ) -> dict[str, float]:
        """Backtrack a step that moved the policy too far: one update with a big KL on its own batch is how a small
        policy loses its tool-call format at once. The optimizer's moments keep the step's gradient."""
        old, bound = torch.cat(proximal), self.config.max_update_kl
        deltas = [p.detach() - b for p, b in zip(self._trainable(), before, strict=True)]
        scale, kl = 1.0, _update_kl(old, torch.cat(self.logprobs(samples)))
        first = kl
        while kl > bound and scale > 1 / 8:
            scale /= 2
            for p, b, d in zip(self._trainable(), before, deltas, strict=True):
                p.copy_(b + scale * d)
            kl = _update_kl(old, torch.cat(self.logprobs(samples)))
        if kl > bound:
            scale, kl = 0.0, 0.0
            for p, b in zip(self._trainable(), before, strict=True):
                p.copy_(b)
        return {"train/update_kl": kl, "train/update_kl_full_step": first, "train/update_scale": scale}

    def _clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.config.max_grad_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        norms = [p.grad.detach().norm() for p in params]
        return float(torch.norm(torch.stack(norms))) if norms else 0.0

    # ---- checkpoints ---------------------------------------------------------------------------------------
    def save(self, out_dir: str | Path) -> Path:
        """Write a peft adapter (lora) or a full HF checkpoint with tokenizer files (full)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out, safe_serialization=True)
        self.save_optimizer(out)
        if self.config.mode == "full":
            import shutil

            for f in Path(self.path).iterdir() if Path(self.path).is_dir() else []:
                if f.name.startswith(("tokenizer", "chat_template", "special_tokens", "vocab", "merges")):
                    shutil.copy(f, out / f.name)
        return out

    def save_optimizer(self, out_dir: str | Path) -> None:
        torch.save({"optimizer": self.optimizer.state_dict(), "steps": self.steps}, Path(out_dir) / "optimizer.pt")

    def load(self, checkpoint: str | Path) -> None:
        """Restore weights (adapter or full) and optimizer state saved by save() + save_optimizer()."""
        ckpt = Path(checkpoint)
        if self.config.mode == "lora":
            from peft import set_peft_model_state_dict
            from safetensors.torch import load_file

            set_peft_model_state_dict(self.model, load_file(ckpt / "adapter_model.safetensors"))
        else:
            from safetensors.torch import load_file

            state = {}
            for f in sorted(ckpt.glob("*.safetensors")):
                state.update(load_file(f))
            self.model.load_state_dict(state, strict=False)
        opt = ckpt / "optimizer.pt"
        if opt.is_file():
            saved = torch.load(opt, weights_only=True)
            self.optimizer.load_state_dict(saved["optimizer"])
            self.steps = int(saved["steps"])

    def lr_info(self) -> dict[str, float]:
        return {"train/lr": self.optimizer.param_groups[0]["lr"], "train/trainable_params": float(self.n_trainable)}


def token_weights(samples: list[Sample], n_traces: int, loss_norm: str, max_len: int) -> torch.Tensor:
    """Each loss token's weight in the loss, (N,) over the samples' loss tokens in order. trace: the sample's
    per-trace token-mean weight ÷ traces (Σ = 1 over a whole batch). constant (Dr. GRPO): 1 / (max_len × traces)
    for every token, so a long trace weighs more than a short one and no trace's length rescales its tokens."""
    if loss_norm == "constant":
        return torch.cat([torch.full((len(_loss_pos(s)),), 1.0 / (max_len * n_traces)) for s in samples])
    return _flat(samples, "weight") / n_traces


def _flat(samples: list[Sample], attr: str) -> torch.Tensor:
    """A per-position attribute of the samples (weight, behaviour logprobs), at their loss tokens only: (N,)."""
    return torch.tensor([getattr(s, attr)[p] for s in samples for p in _loss_pos(s)], dtype=torch.float32)


def _loss_pos(s: Sample) -> list[int]:
    """Indices of loss tokens in a sample (never 0: the first token has no prediction)."""
    return [i for i, m in enumerate(s.loss_mask) if m and i > 0]


def _update_kl(old: torch.Tensor, new: torch.Tensor) -> float:
    """Mean k3 KL(π_old || π_new) on tokens sampled from π_old: the estimator the mismatch metric uses."""
    return float(mismatch_kl(new, old)["train/mismatch_kl"])
