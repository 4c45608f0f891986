"""Training with images, against the real proxy and embedded engine on the tiny vision model: samples carry their
images (sha256, placeholder range, where the bytes are, the image processor settings the engine used), the trainer
makes the engine's pixels again and its logprobs match the engine's within the text bound (and do not without the
pixels), and one GRPO step's gradient reaches the vision tower, the connector and the LM."""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import torch
from PIL import Image

from hrl.train.loop import LoopConfig
from hrl.train.media import MediaError
from hrl.train.samples import build_samples
from hrl.train.step import update_from_traces
from hrl.train.tiny import build_tiny_vision_model
from hrl.train.trainer import Trainer, TrainerConfig
from tests.proxy_helpers import running_proxy

ROUNDINGS = 256  # the text parity bound (tests/runners/engines/test_embedded.py): |Δlogp| <= 2 · R · u · max|z|


def _png(shift: int, size: tuple[int, int]) -> bytes:
    w, h = size
    pixels = ((np.arange(h * w * 3).reshape(h, w, 3) * 7 + shift) % 251).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


ASKED, TOOL = _png(0, (64, 48)), _png(100, (40, 40))  # the user's image, the one inside a tool result


def _url(raw: bytes) -> str:
    import base64

    return f"data:image/png;base64,{base64.b64encode(raw).decode()}"


def _conversation(url: str, token: str, seed: int, asked: bytes = ASKED, in_tool: bytes = TOOL) -> None:
    """Three turns: the user's text and image; a follow-up; a tool's result holding the second image. Each turn
    re-sends the conversation with the model's own replies, so each call extends the one before."""
    client = openai.OpenAI(base_url=f"{url}/s/{token}/v1", api_key="unused", max_retries=0)
    image: Any = {"type": "image_url", "image_url": {"url": _url(asked)}}
    messages: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "what is in it?"}, image]}]
    tool: Any = {"role": "tool", "tool_call_id": "c1",
                 "content": [{"type": "text", "text": "the file:"}, {"type": "image_url", "image_url": {"url": _url(in_tool)}}]}  # fmt: skip
    for nxt in ({"role": "user", "content": "and now?"}, tool, None):
        reply = client.chat.completions.create(model="m", messages=messages, max_tokens=6, temperature=1.0, seed=seed)
        if nxt is not None:
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}, nxt]


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vl", seed=0))


@pytest.fixture(scope="module")
def recorded(vision_model, tmp_path_factory) -> tuple[list[dict], Path]:
    """Four traces of the three-turn conversation (one GRPO group, rewards 1, 0, 1, 0; the last two with another
    first image) and the run's media folder, where the proxy keeps the images as in `hrl train` (`keep_media`: the
    rollouts write the traces, the proxy has no trace file of its own)."""
    media = tmp_path_factory.mktemp("run") / "traces" / "media"
    traces = []
    with running_proxy(vision_model, engine="embedded", engine_options={"dtype": "float32"}) as p:
        p.proxy.keep_media(media)
        for i in range(4):
            p.call(p.proxy.open_session, f"t{i}", {"group_id": "g", "task_id": "t"})
            _conversation(p.url, f"t{i}", seed=i, asked=ASKED if i < 2 else _png(50, (30, 60)))
            traces.append(p.end(f"t{i}", reward=float(i % 2 == 0)))
    assert sorted(f.name for f in media.iterdir()) == sorted(
        hashlib.sha256(b).hexdigest() for b in (ASKED, TOOL, _png(50, (30, 60)))
    )  # each image once
    return traces, media


def test_samples_carry_their_images_and_the_engines_processor_settings(recorded):
    traces, media = recorded
    calls = traces[0]["calls"]
    assert [c.get("parent") for c in calls] == [None, calls[0]["call_id"], calls[1]["call_id"]]  # one branch
    (sample,) = build_samples(traces[0], media_dir=media)
    assert [m["sha256"] for m in sample.media] == [hashlib.sha256(b).hexdigest() for b in (ASKED, TOOL)]
    assert sample.media == calls[2]["media"] and sample.media_dir == str(media)
    assert sample.image_processor == calls[2]["image_processor"] and sample.image_processor["size"] == {
        "longest_edge": 56
    }
    assert sample.loss_tokens == sum(len(c["response_ids"]) for c in calls)  # all three replies in the loss
    for m in sample.media:
        assert (media / m["sha256"]).is_file()


def _bound_and_delta(trainer: Trainer, sample, vision_model: str) -> tuple[float, float, float]:
    """(the text bound for this sample, max |Δlogp| trainer vs engine, the same without the pixels)."""
    from transformers import AutoModelForImageTextToText

    (got,) = trainer.logprobs([sample])
    engine = torch.tensor([sample.behaviour_logprobs[i] for i, m in enumerate(sample.loss_mask) if m and i > 0])
    delta = float((got - engine).abs().max())
    ref = AutoModelForImageTextToText.from_pretrained(vision_model).eval()
    pixels = trainer._pixel_inputs(sample)
    with torch.no_grad():
        z = ref(input_ids=torch.tensor([sample.input_ids]), **pixels).logits
    bound = 2 * ROUNDINGS * torch.finfo(torch.float32).eps / 2 * float(z.abs().max())
    blind = sample.__class__(**{**sample.__dict__, "media": []})  # the same ids, the pixels dropped
    (without,) = trainer.logprobs([blind])
    return bound, delta, float((without - engine).abs().max())


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_trainer_logprobs_match_the_engines_on_a_conversation_with_two_images(recorded, vision_model, mode):
    """Three turns, two images (one inside a tool result): the trainer's logprobs of every sampled token equal the
    engine's within the text bound; with the image tokens' ids alone (no pixels) they do not."""
    traces, media = recorded
    trainer = Trainer(TrainerConfig(model=vision_model, mode=mode, device="cpu", dtype="float32"))
    (sample,) = build_samples(traces[0], media_dir=media)
    bound, delta, blind = _bound_and_delta(trainer, sample, vision_model)
    print(f"\n{mode}: max|Δlogp| trainer vs engine {delta:.2e} (bound {bound:.2e}); without pixels {blind:.2e}")
    assert delta <= bound
    assert blind > 100 * bound


def _grad_norm(trainer: Trainer, part: str) -> float:
    grads = [p.grad.norm() for n, p in trainer.model.named_parameters() if part in n and p.grad is not None]
    return float(torch.stack(grads).norm()) if grads else 0.0


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_one_grpo_step_on_traces_with_images_reaches_the_vision_tower_and_the_lm(
    recorded, vision_model, mode, tmp_path
):
    """LoRA's default targets (q/k/v/o and the MLP projections) adapt the tower's attention and the LM, not the
    connector; full fine-tuning trains all three."""
    traces, media = recorded
    trainer = Trainer(TrainerConfig(model=vision_model, mode=mode, device="cpu", dtype="float32", tree="on"))
    trainer.media_dir = media
    metrics = update_from_traces(trainer, traces, LoopConfig(trainer=trainer.config))
    assert metrics["train/trained_traces"] == 4 and metrics["train/image_traces"] == 0
    assert metrics["train/tree"] == 0.0  # declined for a batch with images, whatever trainer.tree says
    norms = {part: _grad_norm(trainer, part) for part in ("vision_model", "connector", "text_model")}
    print(f"\n{mode}: grad norms {norms}; train/grad_norm {metrics['train/grad_norm']:.3e}")
    assert norms["vision_model"] > 0 and norms["text_model"] > 0
    assert (norms["connector"] > 0) == (mode == "full")
    _published_weights_are_the_trainers(trainer, vision_model, mode, tmp_path)


def _published_weights_are_the_trainers(trainer: Trainer, vision_model: str, mode: str, tmp_path: Path) -> None:
    """The step's checkpoint published to the embedded engine serving the vision model: its tower and LM weights are
    the trainer's (LoRA: the adapter loaded over the base; full: the whole image-text model reloaded)."""
    import asyncio

    from hrl.runners.engines.embedded import EmbeddedEngine, EmbeddedEngineConfig

    path = trainer.save(tmp_path / "v1")

    async def publish() -> dict[str, torch.Tensor]:
        engine = EmbeddedEngine(EmbeddedEngineConfig(model=vision_model, dtype="float32"))
        await engine.start()
        try:
            assert await engine.publish(str(path), mode) == 1
            merged = engine.model.merge_and_unload() if mode == "lora" else engine.model
            return {n: p.detach().clone() for n, p in merged.named_parameters()}
        finally:
            await engine.close()

    from transformers import AutoModelForImageTextToText

    served = asyncio.run(publish())
    base = dict(AutoModelForImageTextToText.from_pretrained(vision_model).named_parameters())
    mine = trainer.model.merge_and_unload() if mode == "lora" else trainer.model
    moved = 0.0
    for name, p in mine.named_parameters():
        if "vision_model" in name or "layers.0.self_attn.q_proj" in name:
            assert torch.allclose(served[name], p.detach(), rtol=0, atol=1e-8), name
            moved = max(moved, float((served[name] - base[name].detach()).abs().max()))
    assert moved > 1e-7  # the step moved them, and the engine serves them moved


def test_images_the_trainer_cannot_use_are_left_out_and_counted(recorded, vision_model, tiny_model, tmp_path, caplog):
    """Bytes missing from media/, or a trainer model without a vision tower: the traces are left out, counted as
    train/image_traces, and why is logged (once per reason)."""
    traces, media = recorded
    trainer = Trainer(TrainerConfig(model=vision_model, mode="lora", device="cpu"))
    trainer.media_dir = tmp_path  # nothing there
    with caplog.at_level(logging.WARNING):
        missing = update_from_traces(trainer, traces, LoopConfig(trainer=trainer.config))
    assert missing["train/image_traces"] == 4 and missing["train/trained_traces"] == 0
    assert "is missing" in caplog.text
    text = Trainer(TrainerConfig(model=tiny_model, mode="lora", device="cpu"))
    text.media_dir = media
    assert update_from_traces(text, traces, LoopConfig(trainer=text.config))["train/image_traces"] == 4


def test_pixels_that_do_not_make_the_recorded_run_are_refused(recorded, vision_model):
    """A processor whose settings expand an image otherwise than the engine did, and an image cut at the sample's
    end, are errors naming the image, never pixels that do not match the ids."""
    traces, media = recorded
    trainer = Trainer(TrainerConfig(model=vision_model, mode="lora", device="cpu"))
    (sample,) = build_samples(traces[0], media_dir=media)
    other = {**sample.image_processor, "do_image_splitting": True, "max_image_size": {"longest_edge": 28}}
    changed = sample.__class__(**{**sample.__dict__, "image_processor": other})
    with pytest.raises(MediaError, match="not the 7 the engine ran"):
        trainer.logprobs([changed])
    offset, length = sample.media[-1]["placeholder"]
    cut = sample.__class__(**{**sample.__dict__, "input_ids": sample.input_ids[: offset + length - 2]})
    with pytest.raises(MediaError, match="is not whole inside"):
        trainer._pixels.of(cut)


def test_a_branch_whose_earlier_call_held_another_image_is_refused(recorded):
    """Samples compare images by hash, not by ids alone: two images expand into the same placeholder ids here, so a
    call whose image differs from what its child's prompt holds where it extends it is an error, never merged."""
    traces, media = recorded
    trace = traces[0]
    first = trace["calls"][0]
    other = {**first, "media": [{**first["media"][0], "sha256": traces[2]["calls"][0]["media"][0]["sha256"]}]}
    assert other["media"][0]["placeholder"] == first["media"][0]["placeholder"]  # the same ids at the same place
    with pytest.raises(ValueError, match="images are not those its child's prompt holds"):
        build_samples({**trace, "calls": [other, *trace["calls"][1:]]}, media_dir=media)


def test_a_training_run_keeps_its_images_where_its_trainer_reads_them(vision_model, tmp_path):
    """`start_trainer` points the trainer and the proxy at the run directory's traces/media: the images an episode
    sends land where the step reads them (hrl train's proxy has no trace file of its own)."""
    import asyncio

    from hrl.runners.rundir import RunDir
    from hrl.train.step import start_trainer

    with running_proxy(vision_model) as p:  # the scripted engine: it expands the images, runs no weights
        cfg = LoopConfig(trainer=TrainerConfig(model=vision_model, mode="lora", device="cpu"))
        trainer, _ = asyncio.run(start_trainer(cfg, RunDir(tmp_path), p.proxy, lambda *_: None))
        client = openai.OpenAI(base_url=f"{p.url}/s/run/v1", api_key="unused", max_retries=0)
        content: Any = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": _url(TOOL)}}]
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=2)
        trace = p.end("run", reward=1.0)
    assert trainer.media_dir == tmp_path / "traces" / "media"
    assert (trainer.media_dir / hashlib.sha256(TOOL).hexdigest()).read_bytes() == TOOL
    assert trace["calls"][0]["image_processor"]["size"] == {"longest_edge": 56}
