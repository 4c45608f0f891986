"""Resolve a model name (local dir or HF id) to something transformers / vLLM can load, or fail clearly."""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hrl.runners.errors import ModelNotFoundError

__all__ = ["FAMILIES", "detect", "detect_model", "model_file", "peft_quietly", "resolve_model", "split_adapter"]

# what in a chat template gives its family away, most specific first (several templates also mention <tool_call>)
_TEMPLATE_MARKERS: list[tuple[str, tuple[str, ...]]] = [
    ("kimi-k2", ("<|tool_calls_section_begin|>",)),
    ("deepseek-v3", ("tool▁calls▁begin",)),
    ("gpt-oss", ("<|channel|>", "<|constrain|>")),
    ("glm45", ("<arg_key>",)),
    ("qwen3-coder", ("<function=", "<parameter=")),
    ("mistral", ("[TOOL_CALLS]",)),
    ("hermes", ("<tool_call>",)),
    ("llama3", ("<|python_tag|>",)),
]
_MODEL_TYPES = {
    "kimi_k2": "kimi-k2",
    "deepseek_v3": "deepseek-v3",
    "deepseek_v32": "deepseek-v3",
    "gpt_oss": "gpt-oss",
    "glm4_moe": "glm45",
    "mistral": "mistral",
    "mistral3": "mistral",
    "mixtral": "mistral",
    "llama": "llama3",
}
_CHATML = "<|im_start|>"  # ChatML's turn marker (Qwen, Hermes, SmolLM2, OpenHermes…)
FAMILIES = tuple(name for name, _ in _TEMPLATE_MARKERS)  # one tool-call parser each (proxy.toolparsers)


@contextlib.contextmanager
def peft_quietly() -> Iterator[None]:
    """peft wraps a model by asking transformers a name it deprecated (`is_gradient_checkpointing`); the call is
    fine, so its FutureWarning stays out of what users read."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name in {".", ".."} or name.count("/") > 1


def resolve_model(name: str) -> str:
    """Return a local directory for `name`, or the HF id itself when it may be downloaded or is cached.

    A path that does not exist, a directory without config.json, or an uncached id with HF_HUB_OFFLINE=1 raises
    ModelNotFoundError naming the model.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model dir {name} has no config.json", hint="point --model at a HF model dir")
        return str(path.resolve())
    if path.exists() or _looks_like_path(name):
        raise ModelNotFoundError(f"model not found: {name}")
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name, "config.json")
    except Exception:
        cached = None
    if isinstance(cached, str):
        return name
    if os.environ.get("HF_HUB_OFFLINE") not in (None, "", "0"):
        raise ModelNotFoundError(
            f"model {name} is not in the local HF cache and HF_HUB_OFFLINE is set",
            hint="download it first, pass a local dir, or build one with `hrl models tiny DIR`",
        )
    return name


def model_file(model: str, name: str) -> Path | None:
    """A file of a model: in its directory, or for an HF id in the local HF cache (huggingface_hub's layout under
    HF_HUB_CACHE; never fetched). None when it has no such file, or none is cached."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path / name if (path / name).is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model, name)
    except Exception:  # not a valid repo id (a missing path, `hrl:tiny`): nothing cached under it
        return None
    return Path(cached) if isinstance(cached, str) else None


def split_adapter(name: str) -> tuple[str, str | None]:
    """`(base model, adapter dir)` for a peft adapter dir (a LoRA checkpoint of `hrl train`), else `(model, None)`.

    The base is the adapter's `base_model_name_or_path`, resolved like any model; a LoRA checkpoint can thus be
    served or evaluated wherever a model is accepted (the engine loads the base, then publishes the adapter).
    """
    path = Path(name).expanduser()
    config = path / "adapter_config.json"
    if not (path.is_dir() and config.is_file() and not (path / "config.json").is_file()):
        return resolve_model(name), None
    try:
        base = json.loads(config.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"adapter dir {name}: unreadable adapter_config.json ({e})") from None
    if not base:
        raise ModelNotFoundError(
            f"adapter dir {name} does not name its base model",
            hint="set base_model_name_or_path in adapter_config.json",
        )
    return resolve_model(base), str(path.resolve())


def detect(template: str, config: dict[str, Any] | None = None) -> str:
    """The family of a model from config.json's `hrl_family` (what `hrl models tiny --family` records), its chat
    template text (markers) and config.json's model_type and architectures; `hermes` when nothing gives it away.
    A ChatML template (`<|im_start|>`) that names no family's markers is `hermes` whatever the model_type: the
    model_type families (Llama 3, Mistral, …) each have a prompt format of their own, which a ChatML model's
    template is not (SmolLM2 is a `llama` in ChatML)."""
    if (config or {}).get("hrl_family") in FAMILIES:
        return str(config["hrl_family"])  # type: ignore[index]
    for name, markers in _TEMPLATE_MARKERS:
        if all(m in template for m in markers):
            return name
    if _CHATML in template:  # a ChatML prompt format is no family's of model_type alone (a Llama or Mistral
        return "hermes"  # fine-tune in ChatML: SmolLM2, OpenHermes); ChatML's tool calls are Hermes `<tool_call>`s
    config = config or {}
    kinds = [str(config.get("model_type", ""))]
    kinds += [str(a).lower().removesuffix("forcausallm").removesuffix("forconditionalgeneration") for a in
              config.get("architectures") or []]  # fmt: skip
    for kind in kinds:
        kind = kind.lower()
        if kind in _MODEL_TYPES:
            return _MODEL_TYPES[kind]
    arch = " ".join(kinds).replace("_", "")
    for key, name in (("kimi", "kimi-k2"), ("deepseekv3", "deepseek-v3"), ("gptoss", "gpt-oss"), ("glm4moe", "glm45")):
        if key in arch:
            return name
    return "hermes"


def detect_model(model_path: str, template: Any = None) -> str:
    """`detect` for a model directory or an HF id (its files from the local HF cache): its tokenizer's chat
    template (given, or read from tokenizer_config.json / chat_template.jinja) and its config.json."""
    text = template if isinstance(template, str) else ""
    if template is not None and not isinstance(template, str):
        text = json.dumps(template, ensure_ascii=False)  # a list of named templates
    if not text:
        for name in ("chat_template.jinja", "tokenizer_config.json"):
            f = model_file(model_path, name)
            if f is not None:
                raw = f.read_text(errors="replace")
                text = raw if name.endswith(".jinja") else str(_json(raw).get("chat_template") or "")
                if text:
                    break
    config_file = model_file(model_path, "config.json")
    return detect(text, _json(config_file.read_text(errors="replace")) if config_file is not None else {})


def _json(raw: str) -> dict[str, Any]:
    try:
        obj = json.loads(raw)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}
