"""The embedded engine against a plain transformers recompute: logprob parity, publishes, pause, abort, limits."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from hrl.runners.engines import SamplingParams, collect, make_engine
from hrl.runners.errors import ContextLengthError, EngineError, EngineStartError, ModelNotFoundError
from tests.models import chat_prompt, hf_greedy, load_hf, recompute_logprobs

SAMPLE = SamplingParams(max_tokens=32, temperature=1.0, seed=7)
GREEDY = SamplingParams(max_tokens=16, temperature=0.0)


def run(coro):
    return asyncio.run(coro)


async def _started(model: str, **options):
    engine = make_engine("embedded", model, **options)
    await engine.start()
    return engine


def _max_delta(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    assert a
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def _logit_scale(model, prompt: list[int], response: list[int]) -> float:
    """The largest |logit| at the positions that predict `response`."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1]
    return float(logits.float().abs().max())


# The KV-cached decode and a whole-sequence recompute round the same weights differently. A logprob is
# z_tok - logsumexp(z), each term off by at most max|Δz|, so |Δlogp| <= 2·max|Δz|, with |Δz| <= R·u·max|z| for the
# unit roundoff u (2^-24 float32, 2^-8 bfloat16) and R roundings:
#   float32: R = 256, the longest reduction (the MLP's 256-term inner products) summed in another order;
#   bfloat16: the kernels accumulate in float32, so the paths differ in the bfloat16 roundings of stored values:
#             R = 2, the logit's own and its inputs'.
ROUNDINGS = {"float32": 256, "bfloat16": 2}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_logprob_parity_base_lora_full(tiny_model, tiny_lora, tiny_full, dtype):
    prompt = chat_prompt(tiny_model)
    ref_dtype = getattr(torch, dtype)
    unit_roundoff = torch.finfo(ref_dtype).eps / 2

    async def go():
        engine = await _started(tiny_model, dtype=dtype)
        try:
            base = await collect(engine.generate("a", prompt, SAMPLE))
            t0 = time.perf_counter()
            await engine.publish(tiny_lora, "lora")
            lora_s = time.perf_counter() - t0
            lora = await collect(engine.generate("b", prompt, SAMPLE))
            t0 = time.perf_counter()
            await engine.publish(tiny_full, "full")
            full_s = time.perf_counter() - t0
            full = await collect(engine.generate("c", prompt, SAMPLE))
            return base, lora, full, lora_s, full_s, engine.version
        finally:
            await engine.close()

    base, lora, full, lora_s, full_s, version = run(go())
    deltas, tols = {}, {}
    for name, gen, ref in [
        ("base", base, load_hf(tiny_model, dtype=ref_dtype)),
        ("lora", lora, load_hf(tiny_model, tiny_lora, dtype=ref_dtype)),
        ("full", full, load_hf(tiny_full, dtype=ref_dtype)),
    ]:
        deltas[name] = _max_delta(gen.logprobs, recompute_logprobs(ref, prompt, gen.token_ids))
        tols[name] = 2 * ROUNDINGS[dtype] * unit_roundoff * _logit_scale(ref, prompt, gen.token_ids)
    print(f"\nembedded {dtype}: max|Δlogp| {deltas} (bounds {tols}); swap lora {lora_s * 1e3:.1f} ms, "
          f"full {full_s * 1e3:.1f} ms")  # fmt: skip
    assert all(deltas[k] <= tols[k] for k in deltas), (deltas, tols)
    assert (base.versions, lora.versions, full.versions) == ([(0, 0)], [(0, 1)], [(0, 2)])
    assert version == 2


def test_publish_changes_greedy_output_to_transformers_greedy(tiny_model, tiny_lora, tiny_full):
    prompt = chat_prompt(tiny_model)

    async def go():
        engine = await _started(tiny_model, dtype="float32")
        try:
            outs = [(await collect(engine.generate("g0", prompt, GREEDY))).token_ids]
            await engine.publish(tiny_lora, "lora")
            outs.append((await collect(engine.generate("g1", prompt, GREEDY))).token_ids)
            await engine.publish(tiny_full, "full")
            outs.append((await collect(engine.generate("g2", prompt, GREEDY))).token_ids)
            return outs
        finally:
            await engine.close()

    base, lora, full = run(go())
    assert base == hf_greedy(load_hf(tiny_model), prompt, len(base))
    assert lora == hf_greedy(load_hf(tiny_model, tiny_lora), prompt, len(lora))
    assert full == hf_greedy(load_hf(tiny_full), prompt, len(full))
    assert base != lora
    assert base != full


def test_batched_generation_matches_single_and_pins_versions(tiny_model, tiny_lora):
    """Different prompt lengths in one left-padded batch give the same greedy ids as alone; a pinned request
    keeps its version while the live one moves on."""
    prompts = [chat_prompt(tiny_model, t) for t in ["hi", "run the tests please and report back", "ls"]]

    async def go():
        engine = await _started(tiny_model, dtype="float32")
        try:
            alone = [(await collect(engine.generate(f"s{i}", p, GREEDY))).token_ids for i, p in enumerate(prompts)]
            together = await asyncio.gather(
                *[collect(engine.generate(f"b{i}", p, GREEDY)) for i, p in enumerate(prompts)]
            )
            await engine.publish(tiny_lora, "lora")
            pinned, live = await asyncio.gather(
                collect(engine.generate("p", prompts[0], GREEDY, version=0)),
                collect(engine.generate("l", prompts[0], GREEDY)),
            )
            return alone, [g.token_ids for g in together], pinned, live
        finally:
            await engine.close()

    alone, together, pinned, live = run(go())
    assert together == alone
    assert pinned.token_ids == alone[0]
    assert pinned.versions == [(0, 0)]
    assert live.versions == [(0, 1)]
    assert live.token_ids != alone[0]


def test_publish_mid_generation_records_two_version_spans(tiny_model, tiny_lora):
    prompt = chat_prompt(tiny_model)

    async def go():
        engine = await _started(tiny_model, dtype="float32")
        try:
            gen_stream = engine.generate("long", prompt, SamplingParams(max_tokens=40, temperature=0.0))
            first = await anext(gen_stream)
            await engine.publish(tiny_lora, "lora")
            rest = await collect(gen_stream)
            return first, rest
        finally:
            await engine.close()

    first, rest = run(go())
    assert first.version == 0
    assert rest.versions
    assert rest.versions[-1][1] == 1


def test_pause_holds_requests_until_resume(tiny_model):
    prompt = chat_prompt(tiny_model)

    async def go():
        engine = await _started(tiny_model)
        try:
            await engine.pause()
            task = asyncio.create_task(collect(engine.generate("w", prompt, GREEDY)))
            await asyncio.sleep(0.3)
            held = not task.done()
            await engine.resume()
            return held, await asyncio.wait_for(task, 30)
        finally:
            await engine.close()

    held, gen = run(go())
    assert held
    assert len(gen.token_ids) == GREEDY.max_tokens


def test_abort_ends_stream_with_abort(tiny_model):
    prompt = chat_prompt(tiny_model)

    async def go():
        engine = await _started(tiny_model)
        try:
            stream = engine.generate("x", prompt, SamplingParams(max_tokens=10_000, temperature=1.0, seed=1))
            await anext(stream)
            await engine.abort("x")
            return await collect(stream)
        finally:
            await engine.close()

    assert run(go()).finish_reason == "abort"


def test_context_overflow_and_unknown_version(tiny_model):
    async def go():
        engine = await _started(tiny_model, max_model_len=64)
        try:
            with pytest.raises(ContextLengthError):
                await collect(engine.generate("o", [5] * 100, GREEDY))
            with pytest.raises(EngineError, match="not loaded"):
                await collect(engine.generate("v", [5] * 10, GREEDY, version=9))
            short = await collect(engine.generate("s", [5] * 60, SamplingParams(max_tokens=100, temperature=0)))
            assert short.finish_reason == "length"
            assert len(short.token_ids) == 4
        finally:
            await engine.close()

    run(go())


def test_a_gpu_the_machine_lacks_is_refused_at_start(tiny_model):
    """`device: cuda:N` past the GPUs torch sees (none on a CPU machine) is refused before a request is taken."""
    beyond = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(EngineStartError, match=f"device=cuda:{beyond}.*CUDA GPU") as refused:
        run(_started(tiny_model, device=f"cuda:{beyond}"))
    assert "engine_options.device=cpu" in (refused.value.hint or "")


@pytest.mark.gpu
def test_on_a_gpu_the_engine_serves_and_publishes_as_on_the_cpu(tiny_model, tiny_lora, tiny_full):
    """The same requests on `device: cuda` and on the CPU, through a LoRA and a full publish: the same greedy tokens,
    and seeded samples within float32 rounding of each other (sampling runs on the CPU for both)."""
    prompt = chat_prompt(tiny_model)

    async def go(device: str):
        engine = await _started(tiny_model, dtype="float32", device=device)
        try:
            outs = [
                await collect(engine.generate("s0", prompt, SAMPLE)),
                await collect(engine.generate("g0", prompt, GREEDY)),
            ]
            await engine.publish(tiny_lora, "lora")
            outs.append(await collect(engine.generate("g1", prompt, GREEDY)))
            await engine.publish(tiny_full, "full")
            outs.append(await collect(engine.generate("g2", prompt, GREEDY)))
            assert next(engine.model.parameters()).device.type == device
            return outs
        finally:
            await engine.close()

    cpu, gpu = run(go("cpu")), run(go("cuda"))
    assert [o.token_ids for o in gpu[1:]] == [o.token_ids for o in cpu[1:]]
    assert gpu[0].token_ids == cpu[0].token_ids
    assert _max_delta(gpu[0].logprobs, cpu[0].logprobs) < 1e-3


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        run(_started(str(tmp_path / "nope")))


def test_lora_checkpoint_is_served_as_its_base_plus_the_adapter(tiny_model, tiny_lora, tmp_path):
    """A LoRA checkpoint of `hrl train` (peft adapter dir) works wherever a model is accepted: `serving` loads the
    base it names and publishes the adapter as policy 1, so its greedy output is the adapter's."""
    from hrl.runners.models import split_adapter
    from hrl.runners.serving.stack import serving

    assert split_adapter(tiny_model) == (tiny_model, None)
    assert split_adapter(tiny_lora) == (tiny_model, tiny_lora)
    prompt = chat_prompt(tiny_model)

    async def go():
        async with serving(tiny_lora) as stack:
            assert stack.engine.version == 1
            return (await collect(stack.engine.generate("g", prompt, GREEDY))).token_ids

    out = run(go())
    assert out == hf_greedy(load_hf(tiny_model, tiny_lora), prompt, len(out))
    nameless = tmp_path / "nameless"
    nameless.mkdir()
    (nameless / "adapter_config.json").write_text('{"base_model_name_or_path": null}')
    with pytest.raises(ModelNotFoundError, match="does not name its base model"):
        split_adapter(str(nameless))


def test_a_vision_model_with_mrope_positions_has_its_images_refused_not_served_wrong(tmp_path):
    """The embedded engine decodes with one position a token; a Qwen2-VL-style model places an image's tokens on a
    grid of rotary positions, so its images are refused with the reason (text is still served); Idefics3's layout,
    one position a token, is served."""
    from transformers import AutoModelForImageTextToText, Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from hrl.runners.engines.images import positions_refusal
    from hrl.train.tiny import build_tiny_vision_model

    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "vocab_size": 200, "bos_token_id": 0, "eos_token_id": 1}  # fmt: skip
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2}
    qwen = Qwen2VLForConditionalGeneration(Qwen2VLConfig(text_config=text, vision_config=vision))
    why = positions_refusal(qwen)
    assert why is not None and "mRoPE" in why and "--engine vllm" in why
    idefics = AutoModelForImageTextToText.from_pretrained(build_tiny_vision_model(tmp_path / "vl", seed=0))
    assert positions_refusal(idefics) is None
