"""Build a tiny vision-language model offline and deterministically: LLaVA's layout at toy size.

`hrl models tiny DIR --vision`: the tiny chat model's tokenizer (the same ids for all text) plus Qwen2-VL's vision
tokens, the ChatML tool template with image parts (`<|vision_start|><|image_pad|><|vision_end|>`, Qwen2-VL's text
layout), a CLIP image processor that turns any image into 4 tokens (28×28 pixels, 14×14 patches), and random weights
for a 2-layer CLIP tower, LLaVA's projector and the tiny chat model's 2-layer Qwen2 decoder. The same seed gives
byte-identical files.

Why LLaVA and not Qwen2-VL: transformers 5's Qwen2-VL (and Qwen2.5-VL, Qwen3-VL) processor cannot be built without
its video processor, which needs torchvision, and neither the trainer's environment nor vLLM's has a CPU build of it
(PyPI's is CUDA-linked and breaks `import torchvision` next to CPU torch). LLaVA's processor is a tokenizer and an
image processor only; transformers 5 and vLLM 0.32 both load LLaVA with a Qwen2 decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hrl.train.tiny.chatml import CHATML_TOOLS_TEMPLATE
from hrl.train.tiny.families import family_spec
from hrl.train.tiny.model import build_tiny_tokenizer

__all__ = ["IMAGE_TOKEN", "VISION_TEMPLATE", "VISION_TOKENS", "TinyVisionConfig", "build_tiny_vision_model"]

# Qwen2-VL's vision tokens, appended after the text tokenizer's vocabulary as Qwen2-VL's sit after Qwen2's; the
# processor expands IMAGE_TOKEN into one per image embedding (config.json's image_token_index)
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
IMAGE_TOKEN = "<|image_pad|>"

_TEXT_ONLY = (
    "{%- elif content is iterable -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- endif -%}{%- endfor -%}"
)
# an image part as the OpenAI chat API ({"type": "image_url"}) or transformers' processors ({"type": "image"}) write it
_WITH_IMAGES = (
    "{%- elif content is iterable -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}"
    "{%- elif part.type in ('image', 'image_url') -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}"
)
assert _TEXT_ONLY in CHATML_TOOLS_TEMPLATE  # the one place the vision template differs from the text one
VISION_TEMPLATE = CHATML_TOOLS_TEMPLATE.replace(_TEXT_ONLY, _WITH_IMAGES)


@dataclass(frozen=True)
class TinyVisionConfig:
    """Shape of the tiny vision-language model: ~0.4M parameters. The decoder is the tiny chat model's (head size 32,
    the smallest vLLM's CPU attention takes); the tower is smaller still (its attention runs on torch's sdpa)."""

    vocab_size: int = 1024  # the BPE's; the vision tokens come on top
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 32768
    initializer_range: float = 0.2  # the decoder's, as the tiny chat model's
    vision_layers: int = 2
    vision_hidden_size: int = 32
    vision_heads: int = 2
    vision_intermediate_size: int = 64
    image_size: int = 28  # pixels per side every image is resized (shortest edge) and center-cropped to
    patch_size: int = 14  # pixels per patch side: (28 / 14)² = 4 image tokens

    @property
    def image_tokens(self) -> int:
        """Image tokens per image: one per patch (the CLS embedding is dropped, LLaVA's "default" strategy)."""
        return (self.image_size // self.patch_size) ** 2


def build_tiny_vision_model(out_dir: str | Path, seed: int = 0, cfg: TinyVisionConfig | None = None) -> Path:
    """Write tokenizer, chat template, image processor, config and random weights (float32 safetensors) to `out_dir`.
    Loads with transformers' AutoProcessor and AutoModelForImageTextToText, and with vLLM's LLaVA."""
    import torch
    from transformers import GenerationConfig, LlavaConfig, LlavaForConditionalGeneration

    cfg = cfg or TinyVisionConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = family_spec("hermes")
    tokenizer = build_tiny_tokenizer(seed, cfg.vocab_size, spec.name)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = VISION_TEMPLATE
    ids = tokenizer.convert_tokens_to_ids
    config = LlavaConfig(
        text_config=_text_config(cfg, len(tokenizer), ids(spec.pad), ids(spec.eos)),
        vision_config=_vision_config(cfg),
        image_token_index=ids(IMAGE_TOKEN),
        image_seq_length=cfg.image_tokens,
        vision_feature_layer=-1,  # the tower's last layer (LLaVA 1.5 takes the one before; with 2 layers, use both)
        vision_feature_select_strategy="default",
        tie_word_embeddings=True,
        torch_dtype="float32",
        hrl_family=spec.name,
    )
    with torch.device("cpu"):
        model = LlavaForConditionalGeneration(config)
    _randomize(model, seed, cfg.initializer_range)
    model.generation_config = GenerationConfig(eos_token_id=ids(spec.eos), pad_token_id=ids(spec.pad), do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    _processor(tokenizer, cfg).save_pretrained(out)
    return out


def _text_config(cfg: TinyVisionConfig, vocab_size: int, pad_id: int, eos_id: int) -> dict[str, object]:
    """The tiny chat model's Qwen2 decoder; `architectures` named, as vLLM builds the decoder from it."""
    return {
        "model_type": "qwen2",
        "architectures": ["Qwen2ForCausalLM"],
        "vocab_size": vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "max_position_embeddings": cfg.max_position_embeddings,
        "initializer_range": cfg.initializer_range,
        "bos_token_id": pad_id,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "tie_word_embeddings": True,
    }


def _vision_config(cfg: TinyVisionConfig) -> dict[str, object]:
    return {
        "model_type": "clip_vision_model",
        "hidden_size": cfg.vision_hidden_size,
        "intermediate_size": cfg.vision_intermediate_size,
        "num_hidden_layers": cfg.vision_layers,
        "num_attention_heads": cfg.vision_heads,
        "image_size": cfg.image_size,
        "patch_size": cfg.patch_size,
        "projection_dim": cfg.vision_hidden_size,
    }


def _randomize(model, seed: int, initializer_range: float) -> None:
    """Seeded weights, parameter by parameter in name order: norms one (their biases zero), other vectors small; the
    decoder's matrices wide as the tiny chat model's, the tower's and the projector's scaled by 1/sqrt(fan-in) so
    that activations stay of order one (a patch has 3 * 14 * 14 = 588 inputs)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "norm" in name:
                p.copy_(torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p))
            elif p.dim() == 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            elif "language_model" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * initializer_range)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * p[0].numel() ** -0.5)


def _processor(tokenizer, cfg: TinyVisionConfig):  # -> LlavaProcessor
    """LLaVA's processor around `tokenizer`: CLIP's image processor (resize the shortest edge, center-crop, CLIP's
    mean and std) at the tower's size, and the image token it expands. The PIL one: it needs no torchvision."""
    from transformers import LlavaProcessor
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    images = CLIPImageProcessorPil(
        size={"shortest_edge": cfg.image_size}, crop_size={"height": cfg.image_size, "width": cfg.image_size}
    )
    return LlavaProcessor(
        image_processor=images,
        tokenizer=tokenizer,
        patch_size=cfg.patch_size,
        vision_feature_select_strategy="default",
        chat_template=VISION_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=1,  # CLIP's CLS embedding, which the "default" strategy then drops
    )
