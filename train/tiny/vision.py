"""Build a tiny vision-language model offline and deterministically: Idefics3's layout (SmolVLM's) at toy size.

`hrl models tiny DIR --vision`: the tiny chat model's tokenizer (the same ids for all text) plus Idefics3's image
tokens, the ChatML tool template with image parts, an image processor that turns any image into one 56×56 view of 4
image tokens, and random weights for a 2-layer SigLIP-style tower, Idefics3's pixel-shuffle connector and a 2-layer
Llama decoder of the tiny chat model's shape. The same seed gives byte-identical files.

Why Idefics3: it is the layout that both transformers 5 and vLLM 0.32 load here. transformers 5's Qwen2-VL,
Qwen2.5-VL and Qwen3-VL processors cannot be built without their video processor, which needs torchvision, and vLLM's
LLaVA, Gemma 3, Mistral 3 and InternVL modules import torchvision; neither the trainer's environment nor vLLM's has a
CPU build of it (PyPI's is CUDA-linked and breaks `import torchvision` next to CPU torch). Idefics3's processor is a
tokenizer and an image processor with a PIL backend, and vLLM's Idefics3 imports no torchvision.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrl.train.tiny.chatml import CHATML_TOOLS_TEMPLATE
from hrl.train.tiny.families import family_spec
from hrl.train.tiny.model import TinyModelConfig, build_tiny_tokenizer

__all__ = ["IMAGE_TOKEN", "MROPE_IMAGE_TOKEN", "MROPE_TEMPLATE", "MROPE_TOKENS", "VISION_LAYOUTS", "VISION_TEMPLATE",
           "VISION_TOKENS", "TinyVisionConfig", "build_tiny_vision_model"]  # fmt: skip

# Idefics3's image tokens, appended after the text tokenizer's vocabulary in this order (so their ids are fixed): the
# processor expands each IMAGE_TOKEN of the rendered prompt into `<fake_token_around_image><global-img>`, one
# IMAGE_TOKEN per image embedding (config.json's image_token_id), and `<fake_token_around_image>`
VISION_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
IMAGE_TOKEN = "<image>"

_TEXT_ONLY = (
    "{%- elif content is iterable -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- endif -%}{%- endfor -%}"
)
# an image part as the OpenAI chat API ({"type": "image_url"}) or transformers' processors ({"type": "image"}) write it
_WITH_IMAGES = (
    "{%- elif content is iterable -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ('image', 'image_url') -%}{{- '<image>' -}}"
    "{%- endif -%}{%- endfor -%}"
)
assert _TEXT_ONLY in CHATML_TOOLS_TEMPLATE  # the one place the vision template differs from the text one
VISION_TEMPLATE = CHATML_TOOLS_TEMPLATE.replace(_TEXT_ONLY, _WITH_IMAGES)

# Qwen2-VL's layout (`layout="qwen2-vl"`): its four vision tokens, appended in this order; the template writes an image
# part as `<|vision_start|><|image_pad|><|vision_end|>` and the processor expands the one `<|image_pad|>` into one per
# merged 2×2 patch of the image's grid, which also places them on multi-dimensional rotary positions (mRoPE)
MROPE_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
MROPE_IMAGE_TOKEN = "<|image_pad|>"
MROPE_TEMPLATE = CHATML_TOOLS_TEMPLATE.replace(
    _TEXT_ONLY, _WITH_IMAGES.replace("'<image>'", "'<|vision_start|><|image_pad|><|vision_end|>'")
)
VISION_LAYOUTS = ("idefics3", "qwen2-vl")


@dataclass(frozen=True)
class TinyVisionConfig(TinyModelConfig):
    """Shape of the tiny vision-language model: ~0.45M parameters, 0.4M of them the decoder's, which has the tiny chat
    model's shape and fields (head size 32, the smallest vLLM's CPU attention takes; `vocab_size` is the BPE's, the
    image tokens come on top); the tower is smaller (attention on sdpa)."""

    vision_layers: int = 2
    vision_hidden_size: int = 32
    vision_heads: int = 2
    vision_intermediate_size: int = 64
    image_size: int = 56  # pixels per side of the one view an image becomes (longest edge resized, then padded)
    patch_size: int = 14  # pixels per patch side: (56 / 14)² = 16 patches
    scale_factor: int = 2  # the connector's pixel shuffle: 2×2 patches per image token, so 4 tokens an image
    layout: str = "idefics3"  # or "qwen2-vl": images on mRoPE positions, 2 to 8 tokens by their aspect (below)
    # qwen2-vl: an image is resized to whole 28-pixel cells (2×2 patches of 14) within these pixel counts: 2 cells
    # (28×56 or 56×28) to 8 (56×112, 112×56), one token a cell; its grid is (1, 2·rows, 2·cols) patches
    min_pixels: int = 28 * 56
    max_pixels: int = 56 * 112

    @property
    def image_tokens(self) -> int:
        """Image tokens per image (Idefics3's image_seq_len)."""
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2


def build_tiny_vision_model(out_dir: str | Path, seed: int = 0, cfg: TinyVisionConfig | None = None) -> Path:
    """Write tokenizer, chat template, image processor, config and random weights (float32 safetensors) to `out_dir`.
    Loads with transformers' AutoProcessor and AutoModelForImageTextToText, and with vLLM's Idefics3; the qwen2-vl
    layout with AutoModelForImageTextToText and `engines.images.load_processor` (AutoProcessor where torchvision is
    installed: Qwen2-VL's processor holds a video processor that needs it)."""
    import torch
    from transformers import GenerationConfig, Idefics3Config, Idefics3ForConditionalGeneration

    cfg = cfg or TinyVisionConfig()
    if cfg.layout not in VISION_LAYOUTS:
        raise ValueError(f"unknown vision layout {cfg.layout!r} (known: {', '.join(VISION_LAYOUTS)})")
    if cfg.layout == "qwen2-vl":
        return _build_qwen2_vl(Path(out_dir), seed, cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec, tokenizer = _tokenizer(seed, cfg, VISION_TOKENS, VISION_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    config = Idefics3Config(
        text_config=_text_config(cfg, len(tokenizer), ids(spec.pad), ids(spec.eos)),
        vision_config=_vision_config(cfg),
        scale_factor=cfg.scale_factor,
        image_token_id=ids(IMAGE_TOKEN),
        tie_word_embeddings=True,
        torch_dtype="float32",
        hrl_family=spec.name,
    )
    with torch.device("cpu"):
        model = Idefics3ForConditionalGeneration(config)
    _randomize(model, seed, cfg.initializer_range)
    model.generation_config = GenerationConfig(eos_token_id=ids(spec.eos), pad_token_id=ids(spec.pad), do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    _processor(tokenizer, cfg).save_pretrained(out)
    return out


def _tokenizer(seed: int, cfg: TinyVisionConfig, tokens: tuple[str, ...], template: str) -> tuple[Any, Any]:
    """(the Hermes family spec, the tiny chat model's tokenizer with a layout's image tokens appended in order and its
    chat template)."""
    spec = family_spec("hermes")
    tokenizer = build_tiny_tokenizer(seed, cfg.vocab_size, spec.name)
    tokenizer.add_special_tokens({"additional_special_tokens": list(tokens)})
    tokenizer.chat_template = template
    return spec, tokenizer


def _text_config(cfg: TinyVisionConfig, vocab_size: int, pad_id: int, eos_id: int) -> dict[str, object]:
    """A Llama decoder (vLLM's Idefics3 builds Llama's) of the tiny chat model's shape and rope base."""
    return {
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "tie_word_embeddings": True,
    }


def _vision_config(cfg: TinyVisionConfig) -> dict[str, object]:
    return {
        "hidden_size": cfg.vision_hidden_size,
        "intermediate_size": cfg.vision_intermediate_size,
        "num_hidden_layers": cfg.vision_layers,
        "num_attention_heads": cfg.vision_heads,
        "image_size": cfg.image_size,
        "patch_size": cfg.patch_size,
    }


def _randomize(model, seed: int, initializer_range: float, decoder: str = "text_model") -> None:
    """Seeded weights, parameter by parameter in name order: norms one (their biases zero), other vectors small; the
    decoder's matrices wide as the tiny chat model's, the tower's and the connector's scaled by 1/sqrt(fan-in) so
    that activations stay of order one (a patch has 3 * 14 * 14 = 588 inputs)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
            elif p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif decoder in name:
                p.copy_(torch.randn(p.shape, generator=gen) * initializer_range)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p[0].numel() ** -0.5)


def _processor(tokenizer, cfg: TinyVisionConfig):  # -> Idefics3Processor
    """Idefics3's processor around `tokenizer`: every image resized (longest edge) and padded to one view of the
    tower's size, no splitting into tiles. The PIL image processor: it needs no torchvision."""
    from transformers import Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    side = {"longest_edge": cfg.image_size}
    images = Idefics3ImageProcessorPil(size=side, max_image_size=side, do_image_splitting=False)
    return Idefics3Processor(
        image_processor=images, tokenizer=tokenizer, image_seq_len=cfg.image_tokens, chat_template=VISION_TEMPLATE
    )


def _build_qwen2_vl(out: Path, seed: int, cfg: TinyVisionConfig) -> Path:
    """Qwen2-VL's layout at toy size: a 2-layer patch tower (14-pixel patches, 2 frames a patch as Qwen2-VL's, 2×2
    merged into one token), the tiny chat model's decoder with mRoPE (its 16 rotary frequencies split 4/6/6 over
    time, height and width, Qwen2-VL's 16/24/24 scaled to a head of 32). The processor's files are written as
    AutoProcessor reads them: tokenizer, `preprocessor_config.json` (the image processor) and
    `processor_config.json` naming Qwen2VLProcessor."""
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    spec, tokenizer = _tokenizer(seed, cfg, MROPE_TOKENS, MROPE_TEMPLATE)
    ids = tokenizer.convert_tokens_to_ids
    text = _text_config(cfg, len(tokenizer), ids(spec.pad), ids(spec.eos))
    head = cfg.hidden_size // cfg.num_heads
    text |= {"model_type": "qwen2_vl_text",
             "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": _mrope_section(head)}}  # fmt: skip
    vision = {"depth": cfg.vision_layers, "embed_dim": cfg.vision_hidden_size, "hidden_size": cfg.hidden_size,
              "num_heads": cfg.vision_heads, "mlp_ratio": cfg.vision_intermediate_size // cfg.vision_hidden_size,
              "patch_size": cfg.patch_size, "spatial_merge_size": cfg.scale_factor, "temporal_patch_size": 2,
              "in_channels": 3}  # fmt: skip
    config = Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids(MROPE_IMAGE_TOKEN),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=True,
        torch_dtype="float32",
        hrl_family=spec.name,
    )
    with torch.device("cpu"):
        model = Qwen2VLForConditionalGeneration(config)
    _randomize(model, seed, cfg.initializer_range, decoder="language_model")
    model.generation_config = GenerationConfig(eos_token_id=ids(spec.eos), pad_token_id=ids(spec.pad), do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    cell = cfg.patch_size * cfg.scale_factor
    images = Qwen2VLImageProcessorPil(min_pixels=cfg.min_pixels, max_pixels=cfg.max_pixels, patch_size=cfg.patch_size,
                                      merge_size=cfg.scale_factor, temporal_patch_size=2)  # fmt: skip
    if cfg.min_pixels % (cell * cell) or cfg.max_pixels % (cell * cell):
        raise ValueError(f"min_pixels and max_pixels must be whole {cell}×{cell} cells")
    images.save_pretrained(out)
    (out / "processor_config.json").write_text('{\n  "processor_class": "Qwen2VLProcessor"\n}\n')
    (out / "chat_template.jinja").write_text(MROPE_TEMPLATE)
    return out


def _mrope_section(head: int) -> list[int]:
    """Rotary frequencies per axis (time, height, width) for a head of `head`: Qwen2-VL's 16/24/24 of 64, scaled."""
    half = head // 2
    if half % 8:
        raise ValueError(f"a head of {head} cannot split its rotary frequencies 2:3:3")
    return [half // 4, half * 3 // 8, half * 3 // 8]
