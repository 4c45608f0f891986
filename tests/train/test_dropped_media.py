"""A trace whose requests lost media to `proxy.media: drop` is left out of training by default, counted as
`train/dropped_media`, and trained on with `train.keep_dropped_media`: traces from the real proxy, a real step."""

from __future__ import annotations

import httpx
import pytest

from hrl.train.loop import LoopConfig
from hrl.train.step import trainable, update_from_traces
from hrl.train.trainer import Trainer, TrainerConfig
from tests.proxy_helpers import running_proxy

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.fixture(scope="module")
def traces(tiny_model) -> list[dict]:
    """One group of three: two text-only episodes (rewards 1 and 0) and one whose image was dropped (reward 1)."""
    episodes = [("plain-1", "fix it", 1.0), ("plain-0", "fix it", 0.0), ("image", [{"type": "text", "text": "fix it"},
                                                                                     IMAGE], 1.0)]  # fmt: skip
    out = []
    with running_proxy(tiny_model, media="drop") as p:
        for token, content, reward in episodes:
            p.call(p.proxy.open_session, token, {"group_id": "g", "task_id": "t"})
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
            r = httpx.post(f"{p.url}/s/{token}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            out.append(p.end(token, reward=reward))
    assert [bool(t.get("dropped_media")) for t in out] == [False, False, True]
    return out


def test_a_trace_with_dropped_media_is_left_out_unless_kept(tiny_model, traces):
    assert [trainable(t) for t in traces] == [True, True, False]
    assert [trainable(t, keep_dropped_media=True) for t in traces] == [True, True, True]
    trainer = Trainer(TrainerConfig(model=tiny_model, mode="full", device="cpu"))
    left_out = update_from_traces(trainer, traces, LoopConfig(trainer=trainer.config))
    assert left_out["train/trained_traces"] == 2 and left_out["train/traces"] == 2
    assert left_out["train/dropped_media"] == 1
    kept = update_from_traces(trainer, traces, LoopConfig(trainer=trainer.config, keep_dropped_media=True))
    assert kept["train/trained_traces"] == 3 and kept["train/traces"] == 3
    assert kept["train/dropped_media"] == 0


def test_hrl_trains_step_line_says_how_many_traces_dropped_media_left_out():
    from hrl.cli.progress import _line

    step = {"step": 3, "version": 2, "trace/reward": 0.5, "trace/count": 8}
    assert "dropped media" not in _line(step)
    assert "left out for dropped media 2" in _line({**step, "train/dropped_media": 2.0})
    assert "images" not in _line(step)
    assert "left out for images 3" in _line({**step, "train/image_traces": 3.0})  # images the trainer cannot use


def test_a_trace_whose_prompts_held_images_is_trainable(traces):
    """Images are trained with their pixels (tests/train/test_images.py); only dropped media leaves a trace out here,
    and images the trainer cannot use are left out where the trainer is known (`update_from_traces`)."""
    plain = traces[0]
    seen = {**plain, "calls": [{**plain["calls"][0], "media": [{"sha256": "0" * 64, "placeholder": [3, 7]}]}]}
    assert trainable(plain) and trainable(seen)
