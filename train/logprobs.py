"""Per-token logprobs of a causal LM without materialising (B, T, V) logits for the whole sequence at once."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["token_logprobs"]


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.base_model, base.get_output_embeddings()


def _chunk_logp(head: Any, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden)  # (B, C, V), in float32 at least (float64 stays float64)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return torch.log_softmax(logits, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, C)


def token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    chunk: int = 512,
    pixels: dict[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """logp[b, t] = log π(input_ids[b, t+1] | input_ids[b, :t+1]), shape (B, T-1).

    The vocabulary projection runs in chunks of `chunk` positions under activation checkpointing, so peak memory
    holds one (B, chunk, V) block instead of (B, T, V) — what makes 150k-token vocabularies fit. `pixels`: a vision
    model's pixel inputs for the images of the rows (`hrl.train.media`), which its backbone puts at their image tokens.
    """
    backbone, head = _backbone_and_head(model)
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, **(pixels or {})
    ).last_hidden_state  # (B, T, H)
    hidden, targets = hidden[:, :-1], input_ids[:, 1:]  # (B, T-1, H), (B, T-1)
    pieces = []
    for s in range(0, hidden.shape[1], chunk):
        h, t = hidden[:, s : s + chunk], targets[:, s : s + chunk]
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_chunk_logp, head, h, t, use_reentrant=False))
        else:
            pieces.append(_chunk_logp(head, h, t))
    return torch.cat(pieces, dim=1)
