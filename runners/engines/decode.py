"""Continuously batched prefill + decode for the embedded engine (requests join and leave the running batch between
steps, their KV caches merged and trimmed), and the KV-cache keyword shim that SFT code shares with it (torch
imported inside the functions, never at import)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Any

from hrl.runners.engines.base import SamplingParams, TokenDelta
from hrl.runners.errors import EngineError

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


@functools.cache
def _last_logits_keyword(model_type: type) -> str | None:
    params = inspect.signature(model_type.forward).parameters
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


def _last_logits_only(model: Any) -> dict[str, Any]:
    """The forward() keyword that computes the logits of the last position only (a prefill needs no others: over a
    512-token prompt at batch 16 the whole logits are 1.6 GB of float32 for a 49k vocabulary), or none where the
    model has no such argument. Works through a peft wrapper."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    keyword = _last_logits_keyword(type(base))
    return {keyword: 1} if keyword else {}


def kv_cache_of(out: Any) -> Any:
    """The KV cache a forward returned (a ModelOutput, whose keys are its fields that are set), under either name."""
    cache = out.get("cache")
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
        whole = torch.tensor([prompt_ids + ids], device=engine.device)
        logits = engine.model(input_ids=whole).logits[0, len(prompt_ids) - 1 : -1]
        logprobs = torch.log_softmax(logits.float(), -1)  # (R, V)
        return [float(x) for x in logprobs.gather(-1, whole[0, len(prompt_ids) :, None])[:, 0]]


@dataclass
class _Rows:
    """The running batch: one row per request, every tensor left-padded to the longest row."""

    reqs: list[Any]
    cache: Any  # the KV cache: per layer, (B, H, T, D) keys and values
    mask: Any  # (B, T): 1 where a cache column holds one of the row's tokens, 0 for left padding
    pos: Any  # (B, 1), or an mRoPE model's (3, B, 1): the position of each row's next input (its own length)
    nxt: Any  # (B, 1): each row's last sampled token, the next step's input


def run_batch(engine: Any, batch: list[Any]) -> None:
    """Generate for `batch` and for the requests that join it, until every one stops, streaming one TokenDelta per
    token. Each step: honour pause and close (`engine._step_gate`); take the requests that join now
    (`engine._admit`, continuous batching); prefill them on a cache of their own and sample their first token; decode
    one token for the running rows; drop the rows that finished and merge the joiners' caches into the batch's."""
    import torch

    rows: _Rows | None = None
    joiners = list(batch)
    while True:
        running = rows.reqs if rows is not None else []
        if not engine._step_gate():
            for r in [*running, *joiners]:
                if not r.done:
                    r.done = True
                    r.send(TokenDelta([], [], r.version, "abort"))
            return
        if rows is not None:
            joiners = engine._admit(running, joinable=rows.pos.dim() == 2 and _kv(rows.cache) is not None)
        for r in [*running, *joiners]:  # live (unpinned) requests follow publishes: the next token is the new weights'
            if not r.pinned:
                r.version = engine.version
        with torch.inference_mode(), _adapter_context(engine, [*running, *joiners][0].version):
            new = _prefill(engine, joiners) if joiners else None
            if rows is not None:
                _decode(engine, rows)
            rows = _merge(_drop_done(rows), _drop_done(new))
        if rows is None:
            return
        joiners = []


def _prefill(engine: Any, reqs: list[Any]) -> _Rows | None:
    """One forward over the left-padded prompts of `reqs` (a request with images alone, its pixels with it), on a new
    KV cache; samples and sends each one's first token. A request aborted before its prefill ends without one."""
    import torch

    for r in reqs:
        if r.aborted:
            r.done = True
            r.send(TokenDelta([], [], r.version, "abort"))
    reqs = [r for r in reqs if not r.done]
    if not reqs:
        return None
    bsz = len(reqs)
    width = max(len(r.prompt) for r in reqs)
    ids = torch.zeros((bsz, width), dtype=torch.long)  # (B, T) left-padded prompts
    mask = torch.zeros((bsz, width), dtype=torch.long)  # (B, T)
    for i, r in enumerate(reqs):
        ids[i, width - len(r.prompt) :] = torch.tensor(r.prompt)
        mask[i, width - len(r.prompt) :] = 1
        r.rng = torch.Generator().manual_seed(r.params.seed) if r.params.seed is not None else None
    ids, mask = ids.to(engine.device), mask.to(engine.device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    pixels = reqs[0].pixels if bsz == 1 and reqs[0].pixels is not None else {}
    pixels = {k: v.to(engine.device) if isinstance(v, torch.Tensor) else v for k, v in pixels.items()}
    if pixels:  # an mRoPE model's images sit on a grid of positions: (3, 1, T), text after them goes on from there
        from hrl.runners.engines.images import rope_positions

        rope = rope_positions(engine.model, ids, mask, pixels)
        positions = positions if rope is None else rope
        pixels = {k: v for k, v in pixels.items() if k != "mm_token_type_ids"}  # the positions are given
    out = engine.model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        **with_kv_cache(engine.model, None),
        **_last_logits_only(engine.model),
        **pixels,  # the prefill of a prompt with images: its pixel inputs
    )
    nxt = _sample(engine, reqs, out.logits[:, -1, :].float())
    # a token after the prompt is text on all axes: (B, 1), or (3, B, 1) after an mRoPE prompt's largest position
    return _Rows(reqs, kv_cache_of(out), mask, positions[..., -1:] + 1, nxt)


def _decode(engine: Any, rows: _Rows) -> None:
    """One decode step of the running rows: feed each its last token, sample and send the next."""
    import torch

    mask = torch.cat([rows.mask, rows.mask.new_ones((len(rows.reqs), 1))], dim=1)
    out = engine.model(
        input_ids=rows.nxt,
        attention_mask=mask,
        position_ids=rows.pos,
        use_cache=True,
        **with_kv_cache(engine.model, rows.cache),
    )
    rows.cache, rows.mask, rows.pos = kv_cache_of(out), mask, rows.pos + 1
    rows.nxt = _sample(engine, rows.reqs, out.logits[:, -1, :].float())


def _sample(engine: Any, reqs: list[Any], logits: Any) -> Any:
    """Sample each row's next token from (B, V) float32 logits, send it with its raw logprob, and mark the requests
    that finished (stop, length) or were aborted. Returns the (B, 1) sampled ids (0 for a row that ended), on the
    model's device. Sampling runs on the CPU wherever the model runs: a request's seeded generator is a CPU one, so a
    seed draws the same tokens on a GPU as on the CPU."""
    import torch

    logits = logits.cpu()
    logprobs = torch.log_softmax(logits, -1)  # (B, V) raw model logprobs, before temperature
    nxt = torch.zeros((len(reqs), 1), dtype=torch.long)
    for i, r in enumerate(reqs):
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
    return nxt.to(engine.device)


# ---- the running batch's KV cache: rows leave, rows join ------------------------------------------------------------


def _kv(cache: Any) -> list[tuple[Any, Any]] | None:
    """Each layer's (keys, values), (B, H, T, D), of a cache whose rows can be merged and trimmed: a DynamicCache of
    full-attention layers (`cache.layers[i].keys/values`, transformers >= 4.56; `key_cache`/`value_cache` lists
    before). None for any other layout (sliding-window or linear-attention layers, a static cache): such a batch
    admits no joiners, it runs to its end as a static one."""
    fields = vars(cache)
    layers = fields.get("layers")
    if layers is not None:
        from transformers.cache_utils import DynamicLayer

        if layers and all(type(layer) is DynamicLayer and layer.is_initialized for layer in layers):
            return [(layer.keys, layer.values) for layer in layers]
        return None
    keys, values = fields.get("key_cache"), fields.get("value_cache")
    if isinstance(keys, list) and isinstance(values, list) and keys and len(keys) == len(values):
        return list(zip(keys, values, strict=True))
    return None


def _set_kv(cache: Any, kv: list[tuple[Any, Any]]) -> None:
    fields = vars(cache)  # the layouts `_kv` knows
    layers = fields.get("layers")
    if layers is not None:
        for layer, (k, v) in zip(layers, kv, strict=True):
            layer.keys, layer.values = k, v
        return
    cache.key_cache[:] = [k for k, _ in kv]
    cache.value_cache[:] = [v for _, v in kv]
    if "_seen_tokens" in fields:  # transformers < 4.49 counts the cached positions itself
        cache._seen_tokens = kv[0][0].shape[-2]


def _drop_done(rows: _Rows | None) -> _Rows | None:
    """The rows whose requests go on (None when none does): the finished ones leave the KV cache, the mask, the
    positions; then the leading columns that are padding in every row left are trimmed."""
    import torch

    if rows is None or all(r.done for r in rows.reqs):
        return None
    keep = [i for i, r in enumerate(rows.reqs) if not r.done]
    if len(keep) < len(rows.reqs):
        idx = torch.tensor(keep, device=rows.mask.device)
        kv = _kv(rows.cache)
        if kv is not None:
            _set_kv(rows.cache, [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in kv])
        elif hasattr(rows.cache, "batch_select_indices"):
            rows.cache.batch_select_indices(idx)
        else:
            import transformers

            raise EngineError(
                f"cannot drop finished rows from a {type(rows.cache).__name__} KV cache (transformers "
                f"{transformers.__version__}): the embedded engine knows DynamicCache's layers or key_cache/value_cache"
            )
        rows.reqs = [rows.reqs[i] for i in keep]
        rows.mask, rows.nxt = rows.mask.index_select(0, idx), rows.nxt.index_select(0, idx)
        rows.pos = rows.pos.index_select(-2, idx)
        kv = _kv(rows.cache)
        first = int(rows.mask.any(0).int().argmax())  # the first column some row's token is in
        if first > 0 and kv is not None:
            _set_kv(rows.cache, [(k[..., first:, :], v[..., first:, :]) for k, v in kv])
            rows.mask = rows.mask[:, first:]
    return rows


def _merge(a: _Rows | None, b: _Rows | None) -> _Rows | None:
    """The rows of `a` then those of `b` in one batch: each layer's keys and values, and the mask, left-padded with
    zeros to the longer of the two and concatenated on the batch dimension; positions and last tokens kept per row
    (callers merge only caches `_kv` knows)."""
    import torch
    import torch.nn.functional as F

    if a is None or b is None:
        return a if b is None else b
    kv_a, kv_b = _kv(a.cache), _kv(b.cache)
    if kv_a is None or kv_b is None:
        raise EngineError(f"cannot merge {type(a.cache).__name__} KV caches")
    width = max(a.mask.shape[1], b.mask.shape[1])

    def pad(x: Any) -> Any:  # (B, H, T, D) -> (B, H, width, D), or (B, T) -> (B, width): zeros on the left
        n = width - (x.shape[-2] if x.dim() == 4 else x.shape[-1])
        return x if n == 0 else F.pad(x, (0, 0, n, 0) if x.dim() == 4 else (n, 0))

    merged = [
        (torch.cat([pad(ka), pad(kb)]), torch.cat([pad(va), pad(vb)]))
        for (ka, va), (kb, vb) in zip(kv_a, kv_b, strict=True)
    ]
    _set_kv(a.cache, merged)
    a.mask = torch.cat([pad(a.mask), pad(b.mask)])
    a.pos, a.nxt = torch.cat([a.pos, b.pos], dim=-2), torch.cat([a.nxt, b.nxt])
    a.reqs = [*a.reqs, *b.reqs]
    return a
