"""`hrl agents doctor --model DIR` with a tiny model of each family: every family once through one fast CLI, and a
non-Hermes family through each other dialect (Responses, Anthropic, Gemini, streamed chat). The whole family × CLI
table is `python bench/families.py`."""

from __future__ import annotations

from typing import Any

import pytest

from hrl.runners.doctor.agents import doctor
from hrl.train.tiny.families import FAMILIES
from tests.conftest import covering, install_agent

# each dialect once, with a family whose syntax differs most from Hermes
BY_DIALECT = {"codex": "gpt-oss", "claude-code": "kimi-k2", "gemini-cli": "glm45", "opencode": "qwen3-coder"}


def _check(name: str, model: str, sandbox: str) -> None:
    (check,) = doctor([name], model, sandbox)  # type: ignore[arg-type]
    assert check.ok, check.reason
    assert check.details["calls"] >= 2


@pytest.mark.agents
@pytest.mark.timeout(1800)  # a first install of a Python CLI takes minutes
# the families test_each_dialect_with_another_family drives a CLI with are the full tier's here
@pytest.mark.parametrize("family", covering(list(FAMILIES), full=list(BY_DIALECT.values())))
def test_every_family_drives_a_cli(family: str, family_model: Any) -> None:
    install_agent("mini-swe-agent", "local")
    _check("mini-swe-agent", family_model(family), "local")


@pytest.mark.agents
@pytest.mark.docker
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("name", "family"), list(BY_DIALECT.items()))
def test_each_dialect_with_another_family(name: str, family: str, family_model: Any) -> None:
    install_agent(name, "docker")
    _check(name, family_model(family), "docker")


def _trace(second_prompt: list[int], parent: bool) -> dict[str, Any]:
    first = {"call_id": "a", "side": False, "dialect": "chat", "prompt_ids": [1, 2, 3], "response_ids": [4, 5, 9],
             "finish_reason": "stop"}  # fmt: skip
    second = {"call_id": "b", "side": False, "dialect": "chat", "prompt_ids": second_prompt, "response_ids": [6],
              "finish_reason": "stop"} | ({"parent": "a"} if parent else {})  # fmt: skip
    return {"calls": [first, second]}


def test_a_fork_at_a_rewritten_stop_token_is_not_drift() -> None:
    from hrl.runners.doctor.agents import trace_problems

    assert trace_problems(_trace([1, 2, 3, 4, 5, 9, 7], parent=True), "chat") == []  # extends token-exactly
    assert trace_problems(_trace([1, 2, 3, 4, 5, 8, 7], parent=False), "chat") == []  # Harmony: <|return|> → <|end|>
    for drifted in (
        [1, 2, 3, 4, 6, 8, 7],
        [1, 2, 3, 4, 5, 8, 7],
    ):  # a sampled id re-tokenized; a fork claiming a parent
        assert trace_problems(_trace(drifted, parent=drifted[4] == 5), "chat") == [
            "call b does not extend call a token-exactly"
        ]
