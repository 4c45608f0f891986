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

__all__ = ["expand_images", "image_run", "image_token_types", "load_processor", "model_has_vision", "pixel_inputs",
           "positions_refusal", "processor_settings", "rope_positions"]  # fmt: skip


def model_has_vision(path: str) -> bool:
    """Whether a local model's config.json has a vision tower (`vision_config`)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and isinstance(config.get("vision_config"), dict)


def _rope_owner(model: Any) -> Any:
    """The module of a vision model that computes multi-dimensional rotary positions (mRoPE: Qwen2-VL, Qwen2.5-VL,
    Qwen3-VL, GLM-4V …: its `get_rope_index`), through a peft wrapper; None for a model of one position a token."""
    tops = [model, model.get_base_model()] if hasattr(model, "get_base_model") else [model]
    seen = [*tops, *(dict(m.named_children()).get("model") for m in tops)]
    return next((m for m in seen if m is not None and callable(getattr(m, "get_rope_index", None))), None)


def _marks_image_tokens(processor: Any) -> bool:
    """Whether a processor returns `mm_token_type_ids`, the image tokens an mRoPE model computes positions from."""
    return bool(getattr(processor, "return_mm_token_type_ids", False))


def positions_refusal(model: Any, processor: Any = None) -> str | None:
    """Why an engine that computes positions in process cannot run this vision model's images (None: it can). A
    model with mRoPE places an image's tokens on a grid computed from its patches (its `get_rope_index`, from which
    tokens are the image's and the image's grid); the embedded engine gives it those when the processor marks the
    image tokens (`return_mm_token_type_ids`), and refuses the images otherwise, never serving them at 1-D
    positions."""
    if _rope_owner(model) is None or _marks_image_tokens(processor):
        return None
    name = type(model).__name__
    return (f"{name} places images with multi-dimensional rotary positions (mRoPE), and its processor does not mark "
            "the image tokens they are computed from; serve it with --engine vllm")  # fmt: skip


def image_token_types(length: int, placeholders: list[tuple[int, int]] | list[list[int]]) -> Any:
    """(1, length) token types, 1 on each image's expanded run and 0 elsewhere (what an mRoPE model's processor
    returns as `mm_token_type_ids`), from the placeholder ranges the engine recorded, never from the ids: a text
    token that happens to equal the image token stays text."""
    import torch

    types = torch.zeros((1, length), dtype=torch.long)
    for offset, n in placeholders:
        types[0, offset : offset + n] = 1
    return types


def rope_positions(model: Any, input_ids: Any, attention_mask: Any, pixels: dict[str, Any]) -> Any:
    """(3, B, T) mRoPE positions of a prompt with images, from the image grid of its pixel inputs and the token types
    made of its placeholder ranges (`image_token_types`); None for a model of one position a token, or pixels
    without token types."""
    owner = _rope_owner(model)
    if owner is None or "mm_token_type_ids" not in pixels:
        return None
    positions, _ = owner.get_rope_index(input_ids=input_ids, mm_token_type_ids=pixels["mm_token_type_ids"],
                                        image_grid_thw=pixels.get("image_grid_thw"), attention_mask=attention_mask)  # fmt: skip
    return positions


def load_processor(path: str) -> tuple[Any, int]:
    """(the model's processor, its image token id), checked against config.json's `image_token_id`."""
    from transformers import AutoConfig, AutoProcessor

    cfg = AutoConfig.from_pretrained(path)
    try:
        processor = AutoProcessor.from_pretrained(path)
    except ImportError as e:  # a part the processor holds needs a library that is not installed
        processor = _images_only_processor(path, e)
    token, ids = vars(processor).get("image_token"), cfg.to_dict()
    tid = ids.get("image_token_id", ids.get("image_token_index"))
    if token is None or processor.tokenizer.convert_tokens_to_ids(token) != tid:
        raise EngineStartError(f"{path}: its processor names image token {token!r}, not config.json's "
                               f"image_token_id {tid}")  # fmt: skip
    return processor, int(tid)


def _images_only_processor(path: str, cause: ImportError) -> Any:
    """The model's own processor class without its video processor, where transformers cannot build that part:
    Qwen2-VL's family (Qwen2.5-VL, Qwen3-VL …) pairs its image processor with a video processor that imports
    torchvision, which has no CPU build in the package registries. hrl sends images only, so it builds the model's
    processor class from its tokenizer and image processor (transformers' PIL one) and leaves the video processor out;
    the expansion of image placeholders is that class's own code. Any other missing library is raised as it was."""
    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer

    name = None
    for f in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        try:
            name = name or json.loads((Path(path) / f).read_text()).get("processor_class")
        except (OSError, ValueError, AttributeError):
            continue
    cls = getattr(transformers, name or "", None)
    if "torchvision" not in str(cause).lower() or cls is None or "video_processor" not in cls.get_attributes():
        raise EngineStartError(f"{path}: its processor could not be loaded: {str(cause).strip()[:300]}") from cause

    class ImagesOnly(cls):  # type: ignore[misc, valid-type]
        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = f"{cls.__name__}ImagesOnly"
    template = Path(path) / "chat_template.jinja"
    return ImagesOnly(image_processor=AutoImageProcessor.from_pretrained(path),
                      tokenizer=AutoTokenizer.from_pretrained(path), video_processor=None,
                      chat_template=template.read_text() if template.is_file() else None)  # fmt: skip


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
        run_ids = image_run(processor, img)
        ids += prompt_ids[last:pos]
        ranges.append((len(ids), len(run_ids)))
        ids += run_ids
        last = pos + 1
    ids += prompt_ids[last:]
    pixels, grids = pixel_inputs(processor, pil, len(ids), ranges)
    return ExpandedPrompt(ids, ranges, processor_settings(processor), grids), pixels


def image_run(processor: Any, image: Any) -> list[int]:
    """The ids the processor expands one image's placeholder into (a PIL image)."""
    run = processor(text=processor.image_token, images=[[image]], add_special_tokens=False)
    return [int(t) for t in run["input_ids"][0]]


def pixel_inputs(
    processor: Any, images: list[Any], length: int, placeholders: list[tuple[int, int]] | list[list[int]]
) -> tuple[dict[str, Any], list[list[int]] | None]:
    """One batch row's pixel inputs for the PIL `images` of a prompt of `length` ids whose images stand at
    `placeholders` (in prompt order): the image processor's tensors, with `mm_token_type_ids` where the model places
    images by them (mRoPE); and each image's patch grid (t, h, w), where the model has one. The engines and training
    make them here alike."""
    pixels = dict(processor.image_processor(images=[images], return_tensors="pt"))
    if _marks_image_tokens(processor):
        pixels["mm_token_type_ids"] = image_token_types(length, placeholders)
    grid = pixels.get("image_grid_thw")
    return pixels, ([[int(x) for x in row] for row in grid.tolist()] if grid is not None else None)
