"""Honest sampling: under `proxy.sampling: honest` (what hrl train uses) every call reaches the engine with the
no-op sampling knobs, whatever the agent sends, so the recorded logprobs are those of the distribution the tokens
were drawn from; each call records what the agent asked for and what was used. Real proxy, embedded engine, tiny
model; the reference logprobs come from a plain transformers forward pass."""

from __future__ import annotations

import pytest
import torch
from openai import OpenAI

from hrl.runners.engines.base import NO_OP_SAMPLING, SamplingParams
from hrl.runners.engines.vllm_server import completion_body
from hrl.runners.trace import call_prompt_ids
from tests.models import load_hf, recompute_logprobs
from tests.proxy_helpers import running_proxy

ASKED = {"temperature": 0.05, "top_p": 0.05, "top_k": 1, "min_p": 0.9, "presence_penalty": 1.0,
         "frequency_penalty": 0.5, "repetition_penalty": 1.3}  # fmt: skip


def _call(tiny_model: str, mode: str) -> tuple[dict, list[int], list[int], list[float]]:
    with running_proxy(tiny_model, engine="embedded", sampling=mode) as p:
        client = OpenAI(base_url=f"{p.url}/s/t/v1", api_key="unused")
        extra = {k: ASKED[k] for k in ("top_k", "min_p", "repetition_penalty")}
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "write something"}], max_tokens=40, seed=3,
            temperature=ASKED["temperature"], top_p=ASKED["top_p"], presence_penalty=ASKED["presence_penalty"],
            frequency_penalty=ASKED["frequency_penalty"], extra_body={**extra, "ignore_eos": True},
        )  # fmt: skip
        trace = p.end("t")
    (call,) = trace["calls"]
    return call["sampling"], call_prompt_ids(trace, 0), call["response_ids"], call["response_logprobs"]


@torch.no_grad()
def _argmax(model, prompt: list[int], response: list[int]) -> list[int]:
    logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return logits.argmax(-1).tolist()


def test_honest_sampling_ignores_the_agents_knobs_and_records_them(tiny_model):
    sampling, prompt, response, logprobs = _call(tiny_model, "honest")
    assert sampling == {"asked": ASKED, "used": NO_OP_SAMPLING}
    model = load_hf(tiny_model)
    # fp32 rounding alone stays under 2·256·2^-24·max|logit| ≈ 3e-4 (see the embedded engine's parity test); a knob
    # applied to the recorded logprobs (temperature 0.05, top_p 0.05) moves them by far more
    assert max(abs(a - b) for a, b in zip(logprobs, recompute_logprobs(model, prompt, response), strict=True)) < 1e-3
    # top_k 1 (or temperature 0.05, or min_p 0.9) would have made every token the argmax; at temperature 1 not
    # (33 of 40 are not; seeded, and at ~80 % a token, 4 or fewer would be a binomial tail under 1e-20)
    assert sum(a != b for a, b in zip(response, _argmax(model, prompt, response), strict=True)) >= 5


def test_agent_sampling_uses_what_the_engine_implements(tiny_model):
    sampling, prompt, response, _ = _call(tiny_model, "agent")
    used = {**NO_OP_SAMPLING, **{k: ASKED[k] for k in ("temperature", "top_p", "top_k", "min_p")}}
    assert sampling == {"asked": ASKED, "used": used}  # the embedded engine has no penalties: sent as no-ops
    assert response == _argmax(load_hf(tiny_model), prompt, response)  # top_k 1: greedy


def test_a_call_that_asks_nothing_records_nothing(tiny_model):
    with running_proxy(tiny_model, sampling="honest") as p:
        OpenAI(base_url=f"{p.url}/s/n/v1", api_key="unused").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
        trace = p.end("n")
    assert "sampling" not in trace["calls"][0]


def test_vllm_gets_every_knob():
    params = SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, repetition_penalty=1.1,
                            presence_penalty=0.2, frequency_penalty=0.3)  # fmt: skip
    body = completion_body("m", [1, 2], params)
    assert {k: body[k] for k in NO_OP_SAMPLING} == {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
                                                     "repetition_penalty": 1.1, "presence_penalty": 0.2,
                                                     "frequency_penalty": 0.3}  # fmt: skip
    assert completion_body("m", [1], SamplingParams())["top_k"] == -1  # vLLM's "no top-k"


@pytest.mark.parametrize(("field", "value"), [("min_p", 2), ("presence_penalty", 9), ("repetition_penalty", 0)])
def test_out_of_range_knobs_are_a_400(tiny_model, field, value):
    import httpx

    with running_proxy(tiny_model) as p:
        body = {"messages": [{"role": "user", "content": "hi"}], field: value}
        r = httpx.post(f"{p.url}/s/x/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400 and field in r.json()["error"]["message"]
