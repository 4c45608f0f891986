"""A model given as an HF id reads what a model directory gives: its config.json (tool-parser detection) and its
generation_config.json (stop ids), from the local HF cache (huggingface_hub's layout under HF_HUB_CACHE), offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from transformers import AutoTokenizer

from hrl.runners import models

COMMIT = "0123456789abcdef0123456789abcdef01234567"

# Both models in one process (the imports dominate its time): what the proxy's template makes of each.
PROBE = """
import json, sys
from hrl.runners.models import resolve_model
from hrl.runners.proxy.template import ChatTemplate
out = {}
for model in sys.argv[1:]:
    t = ChatTemplate(resolve_model(model))
    out[model] = [t.tool_parser.name, t.reasoning_parser.name, list(t.stop_ids)]
print(json.dumps(out))
"""


def _cache(model_dir: str, root: Path, repo_id: str) -> Path:
    """The model laid out in an HF hub cache under `repo_id`, as a download would leave it; returns the cache."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model_dir, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return root


def test_an_hf_id_in_the_cache_detects_and_stops_like_its_directory(family_model, tmp_path):
    model = family_model("gpt-oss")  # its template alone reads as hermes; config.json names the family
    cache = _cache(model, tmp_path / "hub", "org/tiny")
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", PROBE, "org/tiny", model], capture_output=True, text=True,
                         timeout=120, env=env)  # fmt: skip
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["org/tiny"] == seen[model], seen  # the id resolves as the directory does
    tool_parser, _, stops = seen["org/tiny"]
    assert tool_parser == "gpt-oss"
    eos = json.loads((Path(model) / "generation_config.json").read_text())["eos_token_id"]
    assert isinstance(eos, list) and len(eos) > 1 and set(eos) <= set(stops)  # <|call|> and <|return|> both stop
    tok = AutoTokenizer.from_pretrained(model)
    assert tok.convert_tokens_to_ids("<|call|>") in stops


def test_model_file_of_a_directory_and_of_what_is_no_cached_id(tiny_model, tmp_path):
    assert models.model_file(tiny_model, "config.json") == Path(tiny_model) / "config.json"
    assert models.model_file(tiny_model, "no-such.json") is None
    assert models.model_file("hrl:not-an-id", "config.json") is None  # not a repo id: nothing cached, no error
    assert models.model_file(str(tmp_path / "missing"), "config.json") is None
