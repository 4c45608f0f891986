"""A GGUF file → an HF model folder (safetensors, config, tokenizer, chat template) through transformers' own GGUF
reader, which dequantizes every tensor; torch, transformers and `gguf` are imported only here, and only when called."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hrl.runners.errors import PrerequisiteError, UsageError

__all__ = ["DTYPES", "convert_gguf"]

DTYPES = ("float32", "bfloat16", "float16")
METHOD = (
    "transformers' GGUF loader (AutoModelForCausalLM / AutoTokenizer .from_pretrained(gguf_file=)) dequantized every "
    "tensor to float32; its GGUF quantizer was dropped, the weights cast to the dtype, save_pretrained wrote safetensors"
)


def convert_gguf(gguf: Path, out: Path, dtype: str = "float32") -> dict[str, Any]:
    """Write the model of `gguf` (any architecture transformers' GGUF reader knows: llama, mistral, qwen2, …) into
    `out` as an HF folder with weights in `dtype`; returns what the provenance file records of the conversion."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_version = _gguf_version(transformers)
    try:
        with _one_reader():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as e:  # an architecture or a quantization it does not read
        raise UsageError(f"transformers {transformers.__version__} cannot read {gguf}: {e}",
                         hint="give a GGUF of a model family transformers reads (llama, mistral, qwen2, …)") from None  # fmt: skip
    _drop_quantizer(model)
    model.to(getattr(torch, dtype))
    if getattr(model.config, "max_position_embeddings", None):  # a GGUF gives the context length, not this limit
        tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return {
        "method": METHOD,
        "dtype": dtype,
        "architecture": type(model).__name__,
        "params": sum(p.numel() for p in model.parameters()),
        "chat_template": bool(tokenizer.chat_template),
        "transformers": transformers.__version__,
        "gguf": gguf_version,
        "torch": torch.__version__,
    }


def _gguf_version(transformers: Any) -> str:
    """The installed `gguf` package's version, or PrerequisiteError when transformers cannot use it."""
    from importlib.metadata import PackageNotFoundError, version

    from transformers.utils.import_utils import GGUF_MIN_VERSION, is_gguf_available

    if not is_gguf_available():
        raise PrerequisiteError(
            f"reading GGUF files needs the `gguf` package, version {GGUF_MIN_VERSION} or later, which transformers "
            f"{transformers.__version__} uses",
            hint=f"pip install 'gguf>={GGUF_MIN_VERSION}' (it comes with hrl[train])",
        )
    try:
        return version("gguf")
    except PackageNotFoundError:  # importable but not installed as a distribution (a source checkout)
        return "unknown"


def _drop_quantizer(model: Any) -> None:
    """transformers loads a GGUF as a "quantized" model that refuses save_pretrained, although its weights are
    already dequantized; forgetting the GGUF quantizer leaves a plain model that saves as any other."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


@contextlib.contextmanager
def _one_reader() -> Iterator[None]:
    """transformers' GGUF loader parses the file's metadata anew for the tokenizer, the config and the weights (~5 s
    of CPU each for SmolLM2's 49k-token vocabulary, a Python loop over its fields): parse it once per file meanwhile.
    The reader only maps the file read-only, so the three loads read the same values from one reader."""
    import functools
    import os

    import gguf

    reader = gguf.GGUFReader
    readers = functools.lru_cache(maxsize=2)(reader)
    gguf.GGUFReader = lambda path, mode="r": readers(os.path.realpath(path), mode)  # type: ignore[misc]
    try:
        yield
    finally:
        gguf.GGUFReader = reader  # type: ignore[misc]
