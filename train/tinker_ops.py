"""The training half of `hrl serve --tinker`: one LoRA on the served model, driven by Tinker's calls
(`hrl.runners.tinker.LoraTrainer`). hrl's `Trainer` builds the policy, saves and loads checkpoints; here are what the
Tinker API adds: gradients summed over `forward_backward` calls and an AdamW step with each call's own
hyperparameters, and Tinker's losses.

Tinker's losses are sums over the datums' tokens, not means (https://tinker-docs.thinkingmachines.ai/losses): a
client scales them with its `weights` or `advantages`. Every datum's input token i predicts its `target_tokens[i]`."""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from tinker import types
from torch.utils.checkpoint import checkpoint

from hrl.config import TrainerConfig
from hrl.runners.errors import ClientError
from hrl.train.logprobs import _backbone_and_head, _chunk_logp
from hrl.train.loss import policy_loss
from hrl.train.trainer import Trainer

__all__ = ["TinkerLoraTrainer", "tinker_loss"]

_ATTN, _MLP = ["q_proj", "k_proj", "v_proj", "o_proj"], ["gate_proj", "up_proj", "down_proj"]
_NEEDS = {"cross_entropy": ("weights",), "importance_sampling": ("logprobs", "advantages"),
          "ppo": ("logprobs", "advantages")}  # fmt: skip


def tinker_loss(
    name: str, logp: torch.Tensor, inputs: Mapping[str, torch.Tensor], config: Mapping[str, float | str]
) -> tuple[torch.Tensor, dict[str, float]]:
    """Tinker's loss `name` over one datum's (N,) target logprobs; `inputs` its loss_fn_inputs, (N,) each.

    cross_entropy: -Σ weights · logp. importance_sampling (REINFORCE with the sampler's logprobs q):
    -Σ (p/q) · A. ppo (Schulman et al. 2017): -Σ min(r · A, clip(r, low, high) · A), r = p/q, with
    `clip_low_threshold` (0.8) and `clip_high_threshold` (1.2) from the config, hrl's `policy_loss`."""
    if name == "cross_entropy":
        return -(inputs["weights"] * logp).sum(), {}
    q, adv, ones = inputs["logprobs"], inputs["advantages"], torch.ones_like(logp)
    if name == "importance_sampling":
        return -(torch.exp(logp - q) * adv).sum(), {}
    low, high = float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))
    loss, m = policy_loss(logp, q, adv, ones, clip_low=1 - low, clip_high=high - 1)
    return loss, {"clip_frac:mean": m["train/clip_frac"], "ratio:mean": m["train/ratio_mean"]}


class TinkerLoraTrainer:
    """A LoRA of rank `lora.rank` on the attention, MLP and unembedding projections Tinker's LoraConfig names, α = 32,
    AdamW; on `device` (auto: the GPU when there is one)."""

    def __init__(self, path: str, lora: types.LoraConfig, device: str = "auto") -> None:
        targets = (_ATTN if lora.train_attn else []) + (_MLP if lora.train_mlp else [])
        targets += ["lm_head"] if lora.train_unembed else []
        cfg = TrainerConfig(model=path, mode="lora", lora_rank=lora.rank, lora_alpha=32, lora_targets=targets,
                            max_grad_norm=0, lr=1e-4, device=device, seed=lora.seed or 0)  # fmt: skip
        with warnings.catch_warnings():  # LoRA on a tied lm_head adds to its output only; nothing is merged here
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*", category=UserWarning)
            self.trainer = Trainer(cfg)  # fp32 adapters (lora_dtype float32) on any base dtype: a plain AdamW
        assert isinstance(self.trainer.optimizer, torch.optim.AdamW)
        self.pending = 0  # datums whose gradients wait for the next optim_step

    def forward_backward(
        self, data: list[types.Datum], loss_fn: str, config: Mapping[str, float | str], forward_only: bool
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per micro-batch of datums: target logprobs, the loss, and its gradient added to the ones before."""
        model, dev = self.trainer.model, self.trainer.device
        batch = [_datum(d, i, loss_fn) for i, d in enumerate(data)]
        outputs, total, parts = [], 0.0, []
        model.train()
        size = self.trainer.config.micro_batch
        for start in range(0, len(batch), size):
            rows = batch[start : start + size]
            with torch.set_grad_enabled(not forward_only):
                logp = _target_logprobs(model, [r[0] for r in rows], [r[1] for r in rows], dev,
                                        self.trainer.config.logprob_chunk)  # fmt: skip
                losses = [tinker_loss(loss_fn, lp, {k: v.to(dev) for k, v in r[2].items()}, config)
                          for lp, r in zip(logp, rows, strict=True)]  # fmt: skip
                loss = torch.stack([x for x, _ in losses]).sum()
            if not forward_only:
                loss.backward()
            total += float(loss.detach())
            parts += [m for _, m in losses]
            outputs += [{"logprobs": lp.detach().float().cpu().numpy()} for lp in logp]
        self.pending += 0 if forward_only else len(batch)
        metrics = {"loss:sum": total}
        for key in {k for m in parts for k in m}:
            metrics[key] = float(np.mean([m[key] for m in parts if key in m]))
        return outputs, metrics

    def optim_step(self, params: types.AdamParams) -> dict[str, float]:
        """AdamW (decoupled weight decay) with the request's hyperparameters, after a clip to `grad_clip_norm`."""
        opt = self.trainer.optimizer
        for group in opt.param_groups:
            group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                         weight_decay=params.weight_decay)  # fmt: skip
        grads = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        limit = params.grad_clip_norm if params.grad_clip_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(grads, limit)) if grads else 0.0
        opt.step()
        opt.zero_grad(set_to_none=True)
        self.trainer.steps += 1
        done, self.pending = self.pending, 0
        return {"grad_norm:mean": norm, "datums:sum": float(done)}

    def save(self, out: Path, optimizer: bool) -> None:
        """The peft adapter an engine publishes (the LoRA weights only: an adapter on a tied unembedding would
        otherwise carry the whole embedding matrix), and with `optimizer` the optimizer state as `Trainer.load`
        reads it."""
        self.trainer.model.save_pretrained(out, safe_serialization=True, save_embedding_layers=False)
        if optimizer:
            self.trainer.save_optimizer(out)

    def load(self, folder: Path, optimizer: bool) -> None:
        """The adapter saved in `folder`; its optimizer state too with `optimizer`, else the optimizer starts over."""
        self.trainer.load(folder)
        if not optimizer:
            self.trainer.optimizer.state.clear()
            self.trainer.steps = 0


def _datum(d: types.Datum, index: int, loss_fn: str) -> tuple[list[int], torch.Tensor, dict[str, torch.Tensor]]:
    """A datum's input ids, its (N,) target ids and its (N,) float loss inputs; ClientError 400 when they do not
    line up with its N input tokens or one the loss needs is missing."""
    ids = d.model_input.to_ints()
    inputs = dict(d.loss_fn_inputs)
    if "target_tokens" not in inputs or any(k not in inputs for k in _NEEDS[loss_fn]):
        raise ClientError(400, f"datum {index}: {loss_fn} needs loss_fn_inputs "
                               f"{['target_tokens', *_NEEDS[loss_fn]]}, got {sorted(inputs)}")  # fmt: skip
    target = torch.as_tensor(inputs.pop("target_tokens").to_numpy(), dtype=torch.long)
    floats = {k: torch.as_tensor(v.to_numpy(), dtype=torch.float32) for k, v in inputs.items() if k in _NEEDS[loss_fn]}
    for name, t in {"target_tokens": target, **floats}.items():
        if tuple(t.shape) != (len(ids),):
            raise ClientError(400, f"datum {index}: {name} has shape {list(t.shape)}, the input {len(ids)} tokens "
                                   "(hrl takes one target per input token)")  # fmt: skip
    return ids, target, floats


def _target_logprobs(
    model: torch.nn.Module, seqs: list[list[int]], targets: list[torch.Tensor], dev: torch.device, chunk: int
) -> list[torch.Tensor]:
    """log p(targets[b][i] | seqs[b][: i + 1]) for each row b, (N_b,) each: the rows right-padded into one pass, the
    vocabulary projection in chunks as `token_logprobs` does it."""
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)  # (B, T)
    tgt, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for b, (s, t) in enumerate(zip(seqs, targets, strict=True)):
        ids[b, : len(s)], tgt[b, : len(s)], mask[b, : len(s)] = torch.tensor(s), t, 1
    backbone, head = _backbone_and_head(model)
    hidden = backbone(input_ids=ids.to(dev), attention_mask=mask.to(dev)).last_hidden_state  # (B, T, H)
    tgt = tgt.to(dev)
    grad = torch.is_grad_enabled()  # then each chunk's (B, C, V) logits are recomputed in backward, not kept
    pieces = [checkpoint(_chunk_logp, head, hidden[:, s : s + chunk], tgt[:, s : s + chunk], use_reentrant=False)
              if grad else _chunk_logp(head, hidden[:, s : s + chunk], tgt[:, s : s + chunk])
              for s in range(0, width, chunk)]  # fmt: skip
    logp = torch.cat(pieces, dim=1)  # (B, T)
    return [logp[b, : len(s)] for b, s in enumerate(seqs)]
