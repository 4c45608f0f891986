"""Images with a token prompt, for the engines that expand them in process (embedded, scripted): the served
model's processor turns each image placeholder of the prompt into that image's run of tokens and makes the pixel
inputs. The proxy never expands; the engine does, and reports what it ran (`ExpandedPrompt`).

torch, transformers and PIL are imported inside the functions, never at import.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from hrl.runners.engines.base import ExpandedPrompt, ImageInput
from hrl.runners.errors import EngineError, EngineStartError

__all__ = ["expand_images", "load_processor", "model_has_vision", "positions_refusal", "processor_settings"]


def model_has_vision(path: str) -> bool:
    """Whether a local model's config.json has a vision tower (`vision_config`)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def positions_refusal(model: Any) -> str | None:
    """Why an engine that gives 1-D positions cannot run this vision model's images (None: it can). Models with
    multi-dimensional rotary positions (mRoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V …) place an image's tokens on
    a grid computed from its patches (their `get_rope_index`); the embedded engine decodes with one position per
    token, which for such a model is right for text and wrong for every image: refused, never served wrong."""
    inner = getattr(model, "model", None)
    if any(callable(getattr(m, "get_rope_index", None)) for m in (model, inner) if m is not None):
        name = type(model).__name__
        return (f"{name} places images with multi-dimensional rotary positions (mRoPE), which the embedded engine "
                "does not compute (it gives one position a token); serve it with --engine vllm")  # fmt: skip
    return None


def load_processor(path: str) -> tuple[Any, int]:
    """(the model's processor, its image token id), checked against config.json's `image_token_id`."""
    from transformers import AutoConfig, AutoProcessor

    cfg = AutoConfig.from_pretrained(path)
    processor = AutoProcessor.from_pretrained(path)
    token = getattr(processor, "image_token", None)
    tid = getattr(cfg, "image_token_id", getattr(cfg, "image_token_index", None))
    if token is None or processor.tokenizer.convert_tokens_to_ids(token) != tid:
        raise EngineStartError(f"{path}: its processor names image token {token!r}, not config.json's "
                               f"image_token_id {tid}")  # fmt: skip
    return processor, int(tid)


def processor_settings(processor: Any) -> dict[str, Any]:
    """The settings of a processor's image processor (its `to_dict()`: sizes, resampling, rescale and normalisation,
    splitting), which with the image's bytes make its pixels: recorded per call (`image_processor`), so that training
    makes the pixels the engine ran. JSON-ready; the same processor gives the same dict."""
    return json.loads(processor.image_processor.to_json_string())


def expand_images(
    processor: Any, image_token_id: int, prompt_ids: list[int], images: list[ImageInput]
) -> tuple[ExpandedPrompt, dict[str, Any]]:
    """The prompt with each image placeholder (one image token per image, as the template writes it) replaced by
    the run the processor makes of that image, each run's (offset, length), and the pixel inputs of one batch row.
    The placeholders are the engine's to expand: ids sent already expanded would be expanded again, so a count
    that does not match the images is an EngineError."""
    from PIL import Image

    at = [i for i, t in enumerate(prompt_ids) if t == image_token_id]
    if len(at) != len(images):
        raise EngineError(f"the prompt holds {len(at)} image tokens for {len(images)} images (expand each image "
                          "once: send one placeholder per image)")  # fmt: skip
    try:
        pil = [Image.open(io.BytesIO(im.data)).convert("RGB") for im in images]
    except Exception as e:  # the proxy read its header; the pixels themselves may still be broken
        raise EngineError(f"an image could not be decoded: {e}") from None
    ids: list[int] = []
    ranges: list[tuple[int, int]] = []
    last = 0
    for pos, img in zip(at, pil, strict=True):
        run = processor(text=processor.image_token, images=[[img]], add_special_tokens=False)
        run_ids = [int(t) for t in run["input_ids"][0]]
        ids += prompt_ids[last:pos]
        ranges.append((len(ids), len(run_ids)))
        ids += run_ids
        last = pos + 1
    ids += prompt_ids[last:]
    pixels = dict(processor.image_processor(images=[pil], return_tensors="pt"))
    return ExpandedPrompt(ids, ranges, processor_settings(processor)), pixels
