"""Images on multi-dimensional rotary positions (mRoPE), against the real proxy and embedded engine on the tiny
Qwen2-VL-layout model (`hrl models tiny --vision --vision-layout qwen2-vl`): the engine serves them at the positions
the model's own `get_rope_index` gives for the image grid and the recorded placeholder ranges, the trainer rebuilds
those positions from the same grid and ranges and matches the engine's logprobs within the text bound, and the same
ids and pixels at one position a token do not."""

from __future__ import annotations

import hashlib
import io

import pytest
import torch
from PIL import Image

from hrl.runners.engines.images import image_token_types, load_processor, positions_refusal
from hrl.train.loop import LoopConfig
from hrl.train.samples import build_samples
from hrl.train.step import update_from_traces
from hrl.train.tiny import TinyVisionConfig, build_tiny_vision_model
from hrl.train.trainer import Trainer, TrainerConfig
from tests.proxy_helpers import running_proxy
from tests.train.test_images import ROUNDINGS, _conversation, _png

WIDE, TALL = _png(0, (120, 40)), _png(100, (40, 90))  # grids of 2×8 and 6×2 patches: rows and columns differ


@pytest.fixture(scope="module")
def mrope_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-qvl", seed=0,
                                       cfg=TinyVisionConfig(layout="qwen2-vl")))  # fmt: skip


@pytest.fixture(scope="module")
def recorded(mrope_model, tmp_path_factory) -> tuple[list[dict], object]:
    """Two traces of the three-turn conversation (the user's wide image, a tool result's tall one; rewards 1, 0)."""
    media = tmp_path_factory.mktemp("run") / "traces" / "media"
    traces = []
    with running_proxy(mrope_model, engine="embedded", engine_options={"dtype": "float32"}) as p:
        p.proxy.keep_media(media)
        for i in range(2):
            p.call(p.proxy.open_session, f"q{i}", {"group_id": "g", "task_id": "t"})
            _conversation(p.url, f"q{i}", seed=i, asked=WIDE, in_tool=TALL)
            traces.append(p.end(f"q{i}", reward=float(i == 0)))
    return traces, media


def test_the_engine_serves_mrope_images_with_the_processors_expansion(recorded, mrope_model):
    """No refusal: each image is recorded with the run the model's own processor makes of it (one token per merged
    2×2 patch of its grid), and the whole prompt is what the processor makes of the text and both images."""
    traces, media = recorded
    last = traces[0]["calls"][-1]
    processor, image_id = load_processor(mrope_model)
    grids = processor.image_processor(images=[[Image.open(io.BytesIO(b)) for b in (WIDE, TALL)]])["image_grid_thw"]
    assert grids.tolist() == [[1, 2, 8], [1, 6, 2]]
    assert [m["sha256"] for m in last["media"]] == [hashlib.sha256(b).hexdigest() for b in (WIDE, TALL)]
    assert [m["placeholder"][1] for m in last["media"]] == [4, 3]  # 16 / 4 and 12 / 4
    assert [m["grid"] for m in last["media"]] == grids.tolist()  # recorded by the engine
    (sample,) = build_samples(traces[0], media_dir=media)
    for m in sample.media:
        offset, length = m["placeholder"]
        assert sample.input_ids[offset : offset + length] == [image_id] * length
        assert sample.input_ids[offset - 1] == processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")


def _sampled(sample) -> torch.Tensor:
    return torch.tensor([sample.behaviour_logprobs[i] for i, m in enumerate(sample.loss_mask) if m and i > 0])


def test_trainer_logprobs_match_the_engines_at_the_grids_positions_and_not_at_one_position_a_token(
    recorded, mrope_model
):
    """Three turns, two images (one in a tool result): the trainer's logprobs of every sampled token equal the
    engine's within the text bound. The same ids and pixels at 1-D positions, or the ids without pixels, are far
    off: the positions the engine and the trainer agree on are the grid's."""
    from transformers import AutoModelForImageTextToText

    traces, media = recorded
    trainer = Trainer(TrainerConfig(model=mrope_model, mode="lora", device="cpu", dtype="float32"))
    (sample,) = build_samples(traces[0], media_dir=media)
    (got,) = trainer.logprobs([sample])
    engine = _sampled(sample)
    delta = float((got - engine).abs().max())
    pixels = trainer._pixel_inputs(sample)
    assert torch.equal(pixels["mm_token_type_ids"], image_token_types(len(sample.input_ids),
                                                                      [m["placeholder"] for m in sample.media]))  # fmt: skip
    ref = AutoModelForImageTextToText.from_pretrained(mrope_model).eval()
    ids = torch.tensor([sample.input_ids])
    with torch.no_grad():
        z = ref(input_ids=ids, **pixels).logits  # positions from the grid, as the model computes them itself
        flat = ref(input_ids=ids, position_ids=torch.arange(ids.shape[1])[None],
                   **{k: v for k, v in pixels.items() if k != "mm_token_type_ids"}).logits  # fmt: skip
    bound = 2 * ROUNDINGS * torch.finfo(torch.float32).eps / 2 * float(z.abs().max())
    steps = [i for i, m in enumerate(sample.loss_mask) if m and i > 0]
    logp_flat = torch.log_softmax(flat[0].float(), -1)
    at_1d = torch.tensor([float(logp_flat[i - 1, sample.input_ids[i]]) for i in steps])
    blind_sample = sample.__class__(**{**sample.__dict__, "media": []})
    (blind,) = trainer.logprobs([blind_sample])
    one_d, no_pixels = float((at_1d - engine).abs().max()), float((blind - engine).abs().max())
    print(f"\nmax|Δlogp| trainer vs engine {delta:.2e} (bound {bound:.2e}); 1-D positions {one_d:.2e}; "
          f"without pixels {no_pixels:.2e}")  # fmt: skip
    assert delta <= bound
    assert one_d > 100 * bound and no_pixels > 100 * bound


def test_an_image_whose_grid_is_not_the_recorded_one_is_refused(recorded, mrope_model):
    """The grid places the image's tokens: pixels whose grid differs from the one the engine recorded (rows and
    columns swapped here, the same number of tokens) are an error naming the image, never trained at other
    positions."""
    from hrl.train.media import MediaError

    traces, media = recorded
    trainer = Trainer(TrainerConfig(model=mrope_model, mode="lora", device="cpu", dtype="float32"))
    (sample,) = build_samples(traces[0], media_dir=media)
    swapped = [{**m, "grid": [m["grid"][0], m["grid"][2], m["grid"][1]]} for m in sample.media]
    with pytest.raises(MediaError, match=r"patch grid \[1, 2, 8\] where the engine recorded \[1, 8, 2\]"):
        trainer._pixels.of(sample.__class__(**{**sample.__dict__, "media": swapped}))


def test_one_grpo_step_on_mrope_image_traces_reaches_the_tower_and_the_lm(recorded, mrope_model):
    traces, media = recorded
    trainer = Trainer(TrainerConfig(model=mrope_model, mode="full", device="cpu", dtype="float32"))
    trainer.media_dir = media
    metrics = update_from_traces(trainer, traces, LoopConfig(trainer=trainer.config))
    assert metrics["train/trained_traces"] == 2 and metrics["train/image_traces"] == 0
    grads = {part: [p.grad for n, p in trainer.model.named_parameters() if part in n and p.grad is not None]
             for part in ("visual", "language_model")}  # fmt: skip
    assert all(grads.values()) and all(float(torch.stack([g.norm() for g in gs]).norm()) > 0 for gs in grads.values())


def test_an_mrope_model_whose_processor_marks_no_image_tokens_is_refused_images(mrope_model):
    """Without the processor's image-token marks the grid's positions cannot be placed: refused, never 1-D."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(mrope_model)
    processor, _ = load_processor(mrope_model)
    assert positions_refusal(model, processor) is None
    why = positions_refusal(model, object())
    assert why is not None and "mRoPE" in why and "--engine vllm" in why
