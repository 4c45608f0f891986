"""The context-fit estimate: on `hrl models tiny` (32,768 tokens of context) claude-code's and qwen-code's fixed
prompts cannot fit, mini-swe-agent's and aider's can, and the estimate stays at or a little below the prompt
sizes measured through the real proxy (47,246 and 38,795 tokens on that tokenizer)."""

from __future__ import annotations

from pathlib import Path

from hrl.runners.agents import AGENTS
from hrl.runners.agents.fit import context_window, fit

MEASURED = {"claude-code": 47_246, "qwen-code": 38_795}


def test_the_big_prompts_do_not_fit_the_tiny_model_and_the_small_ones_do(tiny_model: str):
    fits = {name: fit(name, tiny_model) for name in AGENTS}
    assert all(f is not None and f.context == 32_768 for f in fits.values())
    assert not fits["claude-code"].fits and not fits["qwen-code"].fits
    assert fits["mini-swe-agent"].fits and fits["aider"].fits
    for name, tokens in MEASURED.items():
        assert 0.85 * tokens <= fits[name].prompt_tokens <= tokens, (name, fits[name].prompt_tokens)


def test_the_context_is_the_proxys_then_the_engines_then_the_models(tiny_model: str):
    model = Path(tiny_model)
    assert context_window(model, {}, {}) == 32_768
    assert context_window(model, {"max_model_len": 4096}, {}) == 4096
    assert context_window(model, {"max_model_len": 4096}, {"max_context": 100_000}) == 100_000
    assert fit("claude-code", tiny_model, proxy={"max_context": 100_000}).fits


def test_rollout_says_so_naming_agent_size_context_and_fix(tiny_model: str):
    from hrl.config import RunConfig
    from hrl.runners.preflight import say_context

    said: list[str] = []
    say_context("claude-code", tiny_model, RunConfig(), said.append)
    assert len(said) == 1, said
    line = said[0]
    assert line.startswith("Warning: claude-code's fixed prompt") and "32,768 tokens" in line, line
    assert "larger context (max_position_embeddings)" in line and "mini-swe-agent (~" in line
    say_context("mini-swe-agent", tiny_model, RunConfig(), said.append)
    assert len(said) == 1, said
