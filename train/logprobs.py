"""Per-token logprobs of a causal LM without materialising (B, T, V) logits for the whole sequence at once."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["LogprobModel", "token_logprobs"]


def _backbone_and_head(model: Any) -> tuple[Any, Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


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


class LogprobModel(torch.nn.Module):
    """A causal LM whose forward returns token_logprobs: one root module for FSDP2, whose forward hooks then cover
    the embeddings and the head that token_logprobs calls apart from the backbone."""

    def __init__(self, model: Any, chunk: int = 512) -> None:
        super().__init__()
        self.inner, self.chunk = model, chunk

    def forward(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        tree: list[list[int]] | None = None,
        pixels: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """(B, T-1) logprobs of padded rows (with `pixels`: their images' pixel inputs); or with `tree`, per
        sequence (T_s-1,) from one packed prefix-trie pass."""
        if tree is not None:
            from hrl.train.tree import tree_logprobs  # tree builds on this module

            return tree_logprobs(self.inner, tree, self.chunk)
        return token_logprobs(self.inner, input_ids, attention_mask, self.chunk, pixels)
