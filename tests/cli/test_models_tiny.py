"""`hrl models tiny --sliding-window W`: the same model as the default build but for the window, which transformers
really applies (on the CPU, with the default sdpa attention)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from hrl.train.logprobs import token_logprobs
from tests.cli.test_main import hrl

WINDOW = 32


def _logprobs(model_dir: str | Path, seq: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    with torch.no_grad():
        return token_logprobs(model, torch.tensor([seq]), torch.ones((1, len(seq)), dtype=torch.long))[0]


def test_sliding_window_builds_the_default_model_with_a_window_every_layer_applies(tiny_model, tmp_path):
    out = hrl("models", "tiny", str(tmp_path / "sw"), "--sliding-window", str(WINDOW), "--json", timeout=600)
    assert out.returncode == 0, out.stderr
    built = Path(json.loads(out.stdout)["path"])
    assert json.loads(out.stdout)["sliding_window"] == WINDOW
    config, default = (json.loads((d / "config.json").read_text()) for d in (built, Path(tiny_model)))
    assert config["sliding_window"] == WINDOW and config["use_sliding_window"] is True
    assert config["layer_types"] == ["sliding_attention"] * config["num_hidden_layers"]
    assert default["sliding_window"] is None and set(default["layer_types"]) == {"full_attention"}
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
    ):  # the same seed: only the window differs
        assert (built / name).read_bytes() == (Path(tiny_model) / name).read_bytes(), name

    seq = [(37 * t + 5) % config["vocab_size"] for t in range(3 * WINDOW)]
    delta = (_logprobs(built, seq) - _logprobs(tiny_model, seq)).abs()  # (3W - 1,)
    # Up to position W - 1 every query sees the same keys: equal but for float32 rounding of the sdpa kernels (logprobs
    # of magnitude <= ~20, eps 1.2e-7, a few dozen roundings deep: < 1e-4). From W on, keys drop out of reach: a
    # random model's prediction moves by whole units somewhere, far above that rounding.
    assert float(delta[:WINDOW].max()) < 1e-4
    assert float(delta[WINDOW:].max()) > 0.1


def test_sliding_window_below_one_is_refused_before_anything_is_written(tmp_path):
    out = hrl("models", "tiny", str(tmp_path / "sw"), "--sliding-window", "0")
    assert out.returncode == 2 and "--sliding-window" in out.stderr
    assert not (tmp_path / "sw").exists()
