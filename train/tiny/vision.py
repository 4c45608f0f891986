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

from hrl.train.tiny.chatml import CHATML_TOOLS_TEMPLATE
from hrl.train.tiny.families import family_spec
from hrl.train.tiny.model import TinyModelConfig, build_tiny_tokenizer

__all__ = ["IMAGE_TOKEN", "VISION_TEMPLATE", "VISION_TOKENS", "TinyVisionConfig", "build_tiny_vision_model"]

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

    @property
    def image_tokens(self) -> int:
        """Image tokens per image (Idefics3's image_seq_len)."""
        return (self.image_size // self.patch_size) ** 2 // self.scale_factor**2


def build_tiny_vision_model(out_dir: str | Path, seed: int = 0, cfg: TinyVisionConfig | None = None) -> Path:
    """Write tokenizer, chat template, image processor, config and random weights (float32 safetensors) to `out_dir`.
    Loads with transformers' AutoProcessor and AutoModelForImageTextToText, and with vLLM's Idefics3."""
    import torch
    from transformers import GenerationConfig, Idefics3Config, Idefics3ForConditionalGeneration

    cfg = cfg or TinyVisionConfig()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec = family_spec("hermes")
    tokenizer = build_tiny_tokenizer(seed, cfg.vocab_size, spec.name)
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)})
    tokenizer.chat_template = VISION_TEMPLATE
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


def _randomize(model, seed: int, initializer_range: float) -> None:
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
            elif "text_model" in name:
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
