"""Policy-gradient losses as pure functions over per-token tensors of shape (N,) — the loss tokens of a batch.

Every function returns `(loss, metrics)`. `weight` carries the normalisation (see `train/samples.py`): per-trace
token mean by default, so Σ weight = number of traces and the loss is averaged over traces by the caller.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["importance_weights", "kl_to_reference", "mismatch_kl", "policy_loss"]


def policy_loss(
    logp: torch.Tensor,
    proximal_logp: torch.Tensor,
    advantages: torch.Tensor,
    weight: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    behaviour_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-ratio surrogate (PPO, Schulman et al. 2017; GRPO, Shao et al. 2024).

    ratio = exp(logp - proximal_logp), clipped to [1 - clip_low, 1 + clip_high]. clip_high > clip_low is DAPO's
    clip-higher (Yu et al. 2025). `behaviour_weight` multiplies each token's term: truncated importance
    sampling against the behaviour policy, or decoupled PPO's behaviour→proximal weight (Hilton et al. 2022,
    AReaL). Normalisation: Σ weight · term (per-trace token mean when weights come from build_samples; Dr.GRPO
    when they are 1 / constant).
    """
    ratio = torch.exp(logp - proximal_logp)  # (N,)
    clipped = ratio.clamp(1 - clip_low, 1 + clip_high)
    term = -torch.minimum(ratio * advantages, clipped * advantages)  # (N,)
    if behaviour_weight is not None:
        term = term * behaviour_weight
    loss = (term * weight).sum()
    with torch.no_grad():
        is_clipped = ((ratio < 1 - clip_low) & (advantages < 0)) | ((ratio > 1 + clip_high) & (advantages > 0))
        wsum = weight.sum().clamp(min=1e-12)
        metrics = {
            "train/clip_frac": float((is_clipped.float() * weight).sum() / wsum),
            "train/ratio_mean": float((ratio * weight).sum() / wsum),
            "train/ratio_max": float(ratio.max()) if ratio.numel() else 1.0,
            # k3 estimate of KL(π_old || π) on the sampled tokens: how far the update has moved from the old policy
            "train/approx_kl": float(((ratio - 1 - torch.log(ratio)) * weight).sum() / wsum),
        }
    return loss, metrics


def importance_weights(
    proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float | None = 2.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights π_prox / π_behav, detached, truncated at `cap` (None = untruncated).

    Truncated IS corrects for tokens sampled by an engine whose numerics or policy version differ from the
    trainer's (Espeholt et al. 2018, IMPALA; "TIS", Yao et al. 2025). Untruncated, with the ratio taken against
    the proximal policy, it is decoupled PPO's behaviour correction (Hilton et al. 2022; AReaL, Fu et al. 2025).
    """
    w = torch.exp(proximal_logp.detach() - behaviour_logp)
    if cap is not None:
        w = w.clamp(max=cap)
    capped = float((w >= cap).float().mean()) if cap is not None and w.numel() else 0.0
    return w, {"train/is_weight_mean": float(w.mean()) if w.numel() else 1.0, "train/is_capped_frac": capped}


def kl_to_reference(
    logp: torch.Tensor, ref_logp: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """k3 estimator of KL(π || π_ref) = E[exp(r) - r - 1], r = ref_logp - logp (Schulman 2020 blog; GRPO)."""
    r = ref_logp - logp
    kl = (torch.exp(r) - r - 1) * weight
    value = kl.sum()
    return value, {"train/kl_ref": float(value.detach())}


def mismatch_kl(trainer_logp: torch.Tensor, behaviour_logp: torch.Tensor) -> dict[str, Any]:
    """Train/infer mismatch on the sampled tokens: mean k1 and k3 estimates of KL(π_behav || π_trainer),
    computed with the trainer's logprobs at update start vs the logprobs the engine recorded."""
    if trainer_logp.numel() == 0:
        return {"train/mismatch_kl": 0.0, "train/mismatch_k1": 0.0, "train/mismatch_max_abs": 0.0}
    d = (trainer_logp.detach() - behaviour_logp).double()  # log π_trainer − log π_behav on tokens from π_behav
    return {
        "train/mismatch_kl": float((torch.exp(d) - d - 1).mean()),
        "train/mismatch_k1": float((-d).mean()),
        "train/mismatch_max_abs": float(d.abs().max()),
    }
