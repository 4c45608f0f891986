"""Will an agent's fixed prompt fit the model's context? Said before the first episode, not learnt from 40
`context_overflow` traces.

Each runner carries `fixed_prompt_chars`: the characters its CLI sends before the task (system prompt and tool
schemas) on the first request, measured at the pinned version. The served model's tokenizer turns characters into
tokens at the rate it shows on `SAMPLE`, text shaped like those prompts (instructions, markdown, JSON tool
schemas). The estimate errs low, never high (the measurement: docs/proxy.md, "Context"), so a prompt said
not to fit does not.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ContextFit", "context_window", "fit", "prompt_tokens"]

SAMPLE = (
    "You are an interactive CLI tool that helps users with software engineering tasks. Use the instructions "
    "below and the tools available to you.\n\n# Doing tasks\n- Read a file before you edit it; keep changes small.\n"
    "- Run `pytest -q` (or the project's test command) before you finish.\n- NEVER commit unless asked.\n\n"
    "<env>\nWorking directory: /repo\nIs directory a git repo: Yes\nPlatform: linux\n</env>\n"
    '{"type":"function","function":{"name":"run_shell_command","description":"Executes a given shell command '
    '(as `bash -c <command>`) and returns stdout, stderr, exit code and signal.","parameters":{"type":"object",'
    '"properties":{"command":{"type":"string","description":"Exact bash command to execute"},"timeout":{'
    '"type":"number","description":"Optional timeout in milliseconds (max 600000)"},"is_background":{"type":'
    '"boolean"}},"required":["command"],"additionalProperties":false,"$schema":"http://json-schema.org/draft-07/'
    'schema#"}}},\n{"type":"function","function":{"name":"edit","description":"Replaces text within a file. '
    'old_string must match exactly, including whitespace and indentation.","parameters":{"type":"object",'
    '"properties":{"file_path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"},'
    '"replace_all":{"type":"boolean","default":false}},"required":["file_path","old_string","new_string"]}}}\n'
)


@dataclass(frozen=True)
class ContextFit:
    agent: str
    prompt_tokens: int  # estimated tokens of the agent's fixed prompt on this model's tokenizer
    context: int  # the context window the episodes get, in tokens

    @property
    def fits(self) -> bool:
        return self.prompt_tokens < self.context


def _model_dir(model: str) -> Path | None:
    """The local folder holding the model's config and tokenizer (an adapter's base for a LoRA checkpoint)."""
    from hrl.runners.models import resolve_model, split_adapter

    base, _ = split_adapter(model)
    path = Path(resolve_model(base))
    return path if path.is_dir() else None


def context_window(model_dir: Path, engine_options: dict[str, Any], proxy: dict[str, Any]) -> int | None:
    """Tokens of context the episodes get: proxy.max_context, else the engine's max_model_len, else the model's
    max_position_embeddings (None when none is known)."""
    for limit in (proxy.get("max_context"), engine_options.get("max_model_len")):
        if isinstance(limit, int) and limit > 0:
            return limit
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return int(value) if value else None


@functools.cache
def _chars_per_token(model_dir: str) -> float:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return len(SAMPLE) / max(1, len(tokenizer(SAMPLE, add_special_tokens=False)["input_ids"]))


def prompt_tokens(chars: int, model_dir: Path) -> int:
    """Estimated tokens of `chars` characters of agent prompt on the tokenizer in `model_dir`."""
    return round(chars / _chars_per_token(str(model_dir)))


def fit(
    agent: str, model: str, engine_options: dict[str, Any] | None = None, proxy: dict[str, Any] | None = None
) -> ContextFit | None:
    """How `agent`'s fixed prompt compares with the context `model` gets; None when either is unknown (a model
    not on this machine, an engine at a URL, an agent without a measured prompt)."""
    from hrl.runners.agents import get_agent

    chars = get_agent(agent).fixed_prompt_chars
    model_dir = _model_dir(model)
    if not chars or model_dir is None:
        return None
    context = context_window(model_dir, engine_options or {}, proxy or {})
    if context is None:
        return None
    return ContextFit(agent, prompt_tokens(chars, model_dir), context)
