"""`hrl models tiny --vision`: a tiny vision-language model that transformers loads from its folder alone, whose
processor expands an image into its placeholder run, whose image reaches the logits, whose loss on text reaches the
tower, and whose files a seed decides byte for byte."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoProcessor

from hrl.train.tiny import TinyVisionConfig, build_tiny_vision_model
from hrl.train.tiny.model import build_tiny_tokenizer
from hrl.train.tiny.vision import IMAGE_TOKEN
from tests.cli.test_main import hrl

CFG = TinyVisionConfig()


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vision_model(tmp_path_factory.mktemp("models") / "tiny-vl", seed=0)


def _image(shift: int) -> Image.Image:
    """A 64×64 RGB pattern; another shift, another picture."""
    return Image.fromarray(((np.arange(64 * 64 * 3).reshape(64, 64, 3) * 7 + shift) % 251).astype("uint8"))


def _inputs(processor, image: Image.Image) -> dict[str, torch.Tensor]:
    messages = [
        {"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "what is this?"}]},
        {"role": "assistant", "content": "a test file"},
    ]
    return processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt")


def test_the_processor_loads_from_the_folder_and_expands_the_image_into_its_placeholder_run(vision_model):
    processor = AutoProcessor.from_pretrained(vision_model, local_files_only=True)
    inputs = _inputs(processor, _image(0))
    ids = inputs["input_ids"][0].tolist()
    tok = processor.tokenizer
    around, glob, image = (
        tok.convert_tokens_to_ids(t) for t in ("<fake_token_around_image>", "<global-img>", IMAGE_TOKEN)
    )
    config = json.loads((vision_model / "config.json").read_text())
    assert config["image_token_id"] == image and config["text_config"]["vocab_size"] == len(tok)
    at = ids.index(around)
    run = [around, glob] + [image] * CFG.image_tokens + [around]  # (56 / 14)² patches, 2×2 per token: 4 image tokens
    assert ids[at : at + len(run)] == run and ids.count(image) == CFG.image_tokens == 4
    assert tuple(inputs["pixel_values"].shape) == (1, 1, 3, CFG.image_size, CFG.image_size)  # (batch, views, C, H, W)
    # text tokenizes as the tiny chat model's tokenizer does: the vision tokens only come on top
    assert tok.encode("def add(a, b):\n    return a + b\n") == build_tiny_tokenizer(0).encode(
        "def add(a, b):\n    return a + b\n"
    )


def test_the_image_reaches_the_logits_and_a_text_loss_reaches_tower_projector_and_decoder(vision_model):
    from transformers import AutoModelForImageTextToText

    processor = AutoProcessor.from_pretrained(vision_model, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(vision_model, local_files_only=True)
    inputs, other = _inputs(processor, _image(0)), _inputs(processor, _image(100))
    assert torch.equal(inputs["input_ids"], other["input_ids"])  # same prompt, other pixels

    logits = model(**inputs).logits  # (1, T, V)
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer))
    assert torch.isfinite(logits).all()
    with torch.no_grad():
        other_logits = model(**other).logits
    # the text after the image attends to it: another picture moves its logits by whole units in a random model;
    # the positions before the image (causal attention) see the same inputs, so they agree but for float32 rounding
    # (eps 1.2e-7 on logits of magnitude ~10: far below 1e-4)
    ids = inputs["input_ids"][0]  # (T,)
    first = ids.tolist().index(processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
    after = first + CFG.image_tokens  # the closing <fake_token_around_image>
    moved = (logits.detach()[0] - other_logits[0]).abs().max(dim=-1).values  # (T,)
    assert float(moved[:first].max()) < 1e-4 and float(moved[after:].max()) > 1e-2

    loss = torch.nn.functional.cross_entropy(logits[0, after:-1], ids[after + 1 :])  # the text positions only
    loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    for part in ("vision_model.embeddings.patch_embedding.weight", "connector.modality_projection.proj.weight",
                 "text_model.layers.0.self_attn.q_proj.weight"):  # fmt: skip
        (grad,) = [g for name, g in grads.items() if name.endswith(part)]
        assert grad is not None and float(grad.abs().sum()) > 0, part


def test_cli_builds_it_byte_identical_to_the_same_seeds_build(vision_model, tmp_path):
    out = hrl("models", "tiny", str(tmp_path / "vl"), "--vision", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    built = Path(result["path"])
    assert result["vision"] is True and result["seed"] == 0
    assert set(result["files"]) >= {"config.json", "model.safetensors", "processor_config.json", "tokenizer.json",
                                    "chat_template.jinja"}  # fmt: skip
    assert sorted(p.name for p in built.iterdir()) == sorted(p.name for p in vision_model.iterdir())
    for f in built.iterdir():  # another process, the same seed: the same bytes
        assert f.read_bytes() == (vision_model / f.name).read_bytes(), f.name
    assert (built / "model.safetensors").stat().st_size < 4 * 2**20  # a few MB at most


def test_cli_refuses_vision_with_another_family_before_anything_is_written(tmp_path):
    out = hrl("models", "tiny", str(tmp_path / "vl"), "--vision", "--family", "gpt-oss")
    assert out.returncode == 2 and "--vision" in out.stderr
    assert not (tmp_path / "vl").exists()


def test_cli_builds_the_qwen2_vl_layout_and_refuses_a_layout_without_vision(tmp_path):
    """`--vision-layout qwen2-vl`: Qwen2-VL's processor files and config (mRoPE sections over time, height and width);
    the option alone, or an unknown layout, is a usage error before anything is written."""
    out = hrl("models", "tiny", str(tmp_path / "qvl"), "--vision", "--vision-layout", "qwen2-vl", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["vision_layout"] == "qwen2-vl"
    assert set(result["files"]) >= {"config.json", "model.safetensors", "preprocessor_config.json",
                                    "processor_config.json", "tokenizer.json", "chat_template.jinja"}  # fmt: skip
    config = json.loads((Path(result["path"]) / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl" and config["text_config"]["rope_parameters"]["mrope_section"] == [4, 6, 6]
    for args in (("--vision-layout", "qwen2-vl"), ("--vision", "--vision-layout", "llava")):
        bad = hrl("models", "tiny", str(tmp_path / "no"), *args)
        assert bad.returncode == 2 and "--vision" in bad.stderr, bad.stderr
    assert not (tmp_path / "no").exists()
