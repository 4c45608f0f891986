"""Batched prefill + decode for the embedded engine, and the KV-cache keyword shim that SFT code shares with it
(torch imported inside the functions, never at import)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any

from hrl.runners.engines.base import SamplingParams, TokenDelta

__all__ = ["kv_cache_of", "run_batch", "sample_token", "with_kv_cache"]


@functools.cache
def _kv_keyword(model_type: type) -> str:
    params = inspect.signature(model_type.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def with_kv_cache(model: Any, cache: Any) -> dict[str, Any]:
    """The forward() keyword argument that passes a KV cache: `cache` in newer transformers (which deprecate
    `past_key_values`, with a warning on every run), `past_key_values` before. Works through a peft wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_kv_keyword(type(base)): cache}


def kv_cache_of(out: Any) -> Any:
    """The KV cache a forward returned, under either name."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def sample_token(logits: Any, params: SamplingParams, generator: Any) -> int:
    """Sample one id from a (V,) float32 logits row with temperature / top-k / top-p / min-p; temperature 0 =
    greedy."""
    import torch

    if params.temperature <= 0:
        return int(torch.argmax(logits))
    x = logits / params.temperature
    if 0 < params.top_k < x.numel():
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, -1)
        drop = probs.cumsum(-1) - probs > params.top_p  # keep the smallest prefix whose mass reaches top_p
        x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
    probs = torch.softmax(x, -1)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return int(torch.multinomial(probs, 1, generator=generator))


def _adapter_context(engine: Any, version: int) -> Any:
    """Select the LoRA adapter of `version` for the next forward (batches are homogeneous in version).

    peft's mixed-batch path (`adapter_names`) is avoided on purpose: in bf16 it rounds differently from the
    regular forward the trainer uses (max |Δlogp| 0.37 vs 0 measured on the tiny model).
    """
    from peft import PeftModel

    if not isinstance(engine.model, PeftModel):
        return contextlib.nullcontext()
    adapter = engine._adapters.get(version)
    if adapter is None:
        return engine.model.disable_adapter()
    engine.model.set_adapter(adapter)
    return contextlib.nullcontext()


def score_ids(engine: Any, prompt_ids: list[int], ids: list[int]) -> list[float]:
    """Teacher-forced raw logprobs (temperature 1) of `ids` after `prompt_ids` under the live version, in one
    forward pass without a KV cache: what the logprobs recorded for those ids, when sampled, must equal."""
    import torch

    with torch.no_grad(), _adapter_context(engine, engine.version):
        logits = engine.model(input_ids=torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), -1)  # (R, V)
        return [float(x) for x in logprobs.gather(-1, torch.tensor(ids)[:, None])[:, 0]]


def run_batch(engine: Any, batch: list[Any]) -> None:
    """Generate for every request in `batch` until each stops, streaming one TokenDelta per token."""
    import torch

    bsz = len(batch)
    width = max(len(r.prompt) for r in batch)
    ids = torch.zeros((bsz, width), dtype=torch.long)  # (B, T) left-padded prompts
    mask = torch.zeros((bsz, width), dtype=torch.long)  # (B, T)
    for i, r in enumerate(batch):
        ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt)
        mask[i, width - len(r.prompt) :] = 1
        r.rng = torch.Generator().manual_seed(r.params.seed) if r.params.seed is not None else None
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    pixels = batch[0].pixels if bsz == 1 and getattr(batch[0], "pixels", None) is not None else {}
    if pixels:  # an mRoPE model's images sit on a grid of positions: (3, 1, T), text after them goes on from there
        from hrl.runners.engines.images import rope_positions

        rope = rope_positions(engine.model, ids, mask, pixels)
        positions = positions if rope is None else rope
        pixels = {k: v for k, v in pixels.items() if k != "mm_token_type_ids"}  # the positions are given
    past = None
    while True:
        if not engine._step_gate():
            for r in batch:
                if not r.done:
                    r.done = True
                    r.send(TokenDelta([], [], r.version, "abort"))
            return
        for r in batch:  # live (unpinned) requests follow publishes: the next token comes from the new weights
            if not r.pinned:
                r.version = engine.version
        with torch.inference_mode(), _adapter_context(engine, batch[0].version):
            out = engine.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **with_kv_cache(engine.model, past),
                **pixels,  # the prefill of a prompt with images: its pixel inputs, once
            )
        pixels = {}
        past = kv_cache_of(out)
        logits = out.logits[:, -1, :].float()  # (B, V)
        logprobs = torch.log_softmax(logits, -1)  # (B, V) raw model logprobs, before temperature
        nxt = torch.zeros((bsz, 1), dtype=torch.long)
        for i, r in enumerate(batch):
            if r.done:
                continue
            if r.aborted:
                r.done = True
                r.send(TokenDelta([], [], r.version, "abort"))
                continue
            tok = sample_token(logits[i], r.params, r.rng)
            nxt[i, 0] = tok
            r.generated += 1
            finish = None
            if not r.params.ignore_eos and (tok in engine._eos or tok in r.params.stop_token_ids):
                finish = "stop"
            elif r.generated >= r.params.max_tokens or len(r.prompt) + r.generated >= engine.max_model_len:
                finish = "length"
            r.done = finish is not None
            r.send(TokenDelta([tok], [float(logprobs[i, tok])], r.version, finish))
        if all(r.done for r in batch):
            return
        ids = nxt
        mask = torch.cat([mask, torch.ones((bsz, 1), dtype=torch.long)], dim=1)
        positions = positions[..., -1:] + 1  # (B, 1), or (3, B, 1): a token after the prompt is text on all axes
