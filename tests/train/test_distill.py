"""On-policy distillation (`distill:`): the teacher's per-token reverse KL enters the loss as a dense advantage.

Through the real sync loop (proxy, embedded engine, trainer): the student's own starting model as the teacher gives a
`distill/reverse_kl` below 1e-3 at step 0. On samples: a different teacher's term is −coef × (student − teacher) on
each loss token, exactly, and the trainer trains on it when every trace's own advantage is 0."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from hrl.config import DistillConfig, RunConfig
from hrl.errors import UsageError
from hrl.runners.preflight import check_teacher
from hrl.runners.rundir import RunDir
from hrl.train.advantages import group_advantages
from hrl.train.distill import Teacher, distill
from hrl.train.loop import LoopConfig
from hrl.train.samples import Sample
from hrl.train.trainer import Trainer, TrainerConfig
from tests.models import chat_prompt, load_hf, recompute_logprobs
from tests.train.test_loop import _run


@pytest.mark.parametrize(("mode", "tree"), [("lora", "off"), ("full", "on")])
def test_the_students_own_model_as_teacher_gives_no_reverse_kl_at_step_0(mode, tree, tiny_model, tmp_path):
    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=2, tasks_per_iteration=2, group_size=2, concurrency=2, advantage="distill",
                     distill=DistillConfig(teacher=tiny_model),
                     trainer=TrainerConfig(model=tiny_model, mode=mode, tree=tree, lr=1e-2))  # fmt: skip
    run.create(cfg.model_dump())
    asyncio.run(_run(tiny_model, run, cfg))
    lines = [json.loads(x) for x in (run.path / "metrics.jsonl").read_text().splitlines()]
    print("\n" + "\n".join(f"{mode} step {m['step']}: distill/reverse_kl {m['distill/reverse_kl']:.2e} over "
                           f"{m['distill/tokens']:.0f} tokens, time/distill_s {m['time/distill_s']:.3f}"
                           for m in lines))  # fmt: skip
    first = lines[0]
    assert abs(first["distill/reverse_kl"]) < 1e-3 and first["distill/tokens"] > 0, first
    assert all(m["time/distill_s"] > 0 for m in lines)
    assert first["train/tree"] == float(tree == "on")
    assert first["train/skipped"] == 0.0  # advantage distill: every trace's own advantage is 0, the teacher's is not


def test_the_async_loop_distills_too_with_no_reverse_kl_from_the_students_own_model(tiny_model, tmp_path):
    """--async: the teacher prefills each batch the producer's episodes fill, beside the episodes still running; the
    student's own starting model as the teacher gives no reverse KL at step 0 (its tokens sampled by version 0)."""
    from hrl.config import AsyncConfig
    from tests.train.test_async_loop import _run as run_async

    run = RunDir(tmp_path / "run")
    cfg = LoopConfig(iterations=2, tasks_per_iteration=1, group_size=2, advantage="distill",
                     distill=DistillConfig(teacher=tiny_model),
                     trainer=TrainerConfig(model=tiny_model, lr=1e-2))  # fmt: skip
    acfg = AsyncConfig(max_in_flight=4, batch_traces=4, max_buffered=8)
    run.create(cfg.model_dump())
    history = asyncio.run(run_async(tiny_model, run, cfg, acfg, "mixed"))
    first = history[0]
    assert abs(first["distill/reverse_kl"]) < 1e-3 and first["distill/tokens"] > 0, first
    assert all(m["time/distill_s"] > 0 for m in history) and first["train/skipped"] == 0.0


def _samples(model_dir: str, behaviour_model: str) -> list[Sample]:
    """Two branches of one trace sharing their first response (the second's prompt extends the first call), and a
    second trace; behaviour logprobs are the student's own, as the engine records them."""
    student = load_hf(behaviour_model)
    prompt = chat_prompt(model_dir)
    r1, suffix, r2 = [40, 41, 42, 43], [7, 8], [50, 51, 52]

    def sample(trace: str, parts: list[tuple[list[int], int]]) -> Sample:
        ids, mask, logps = [], [], []
        for part, trained in parts:
            lps = recompute_logprobs(student, ids, part) if trained else [0.0] * len(part)
            ids, mask, logps = ids + part, mask + [trained] * len(part), logps + lps
        return Sample(trace_id=trace, group_id="g", branch=[], input_ids=ids, loss_mask=mask,
                      behaviour_logprobs=logps, versions=[0 if m else -1 for m in mask], weight=[0.1] * len(ids))  # fmt: skip

    return [
        sample("a", [(prompt, 0), (r1, 1)]),
        sample("a", [(prompt, 0), (r1, 1), (suffix, 0), (r2, 1)]),
        sample("b", [(prompt, 0), (r2, 1)]),
    ]


def test_a_different_teacher_sets_minus_coef_times_the_reverse_kl_on_each_token(tiny_model, tiny_full):
    samples = _samples(tiny_model, tiny_model)
    teacher = Teacher(DistillConfig(teacher=tiny_full, batch_tokens=64), torch.device("cpu"), torch.float32)
    metrics = distill(samples, teacher, coef=0.5)
    reference = load_hf(tiny_full)
    kls = {}
    for s in samples:
        expected = teacher.logprobs([s])[0]
        for t, m in enumerate(s.loss_mask):
            want = -0.5 * (s.behaviour_logprobs[t] - expected[t]) if m else 0.0
            assert s.dense_advantage[t] == want  # exactly the term, nothing else
            if m:  # the teacher's logprob is the model's own (a plain forward over the prefix)
                got = recompute_logprobs(reference, s.input_ids[:t], [s.input_ids[t]])[0]
                assert expected[t] == pytest.approx(got, abs=1e-4)
                kls[(s.trace_id, tuple(s.input_ids[: t + 1]))] = s.behaviour_logprobs[t] - expected[t]
    assert metrics["distill/tokens"] == len(kls) == 4 + 3 + 3  # r1 shared by both branches of trace a: once
    assert metrics["distill/reverse_kl"] == pytest.approx(sum(kls.values()) / len(kls), abs=1e-9)
    assert abs(metrics["distill/reverse_kl"]) > 0.05, metrics  # a perturbed model: clearly not the student
    for s in samples:
        s.advantage = 1.0
        assert s.token_advantages() == [1.0 + d for d in s.dense_advantage]


def test_a_lora_checkpoint_teaches_as_its_base_with_the_adapter(tiny_model, tiny_lora):
    """A run's LoRA checkpoint as the teacher: its base with the adapter merged, as the engine serves it."""
    samples = _samples(tiny_model, tiny_model)[:1]
    got = Teacher(DistillConfig(teacher=tiny_lora), torch.device("cpu"), torch.float32).logprobs(samples)[0]
    s, served = samples[0], load_hf(tiny_model, adapter=tiny_lora)
    want = [recompute_logprobs(served, s.input_ids[:t], [s.input_ids[t]])[0] for t in range(1, len(s.input_ids))]
    assert got[1:] == pytest.approx(want, abs=1e-4)


def test_the_trainer_trains_on_the_dense_term_alone(tiny_model, tiny_full):
    """train.advantage=distill gives every trace 0; the step is not skipped, and it moves the student toward the
    teacher on the tokens it was trained on."""
    adv, _ = group_advantages({"a": 1.0, "b": 1.0}, {"a": "g", "b": "g"}, "distill", drop_zero_variance=True)
    assert adv == {"a": 0.0, "b": 0.0}  # none dropped though the group agrees: the signal is the teacher's
    samples = _samples(tiny_model, tiny_model)
    teacher = Teacher(DistillConfig(teacher=tiny_full), torch.device("cpu"), torch.float32)
    distill(samples, teacher, coef=1.0)
    before = sum(d * d for s in samples for d in s.dense_advantage)  # Σ (student − teacher)² on the loss tokens
    trainer = Trainer(TrainerConfig(model=tiny_model, mode="full", lr=1e-3, correction="none"))
    metrics = trainer.step(samples)
    assert metrics["train/skipped"] == 0.0 and metrics["train/grad_norm"] > 0, metrics
    after = [lp.tolist() for lp in trainer.logprobs(samples)]  # the student's logprobs on the loss tokens now
    for s, lp in zip(samples, after, strict=True):
        positions = [t for t, m in enumerate(s.loss_mask) if m and t > 0]
        s.behaviour_logprobs = [0.0] * len(s.input_ids)
        for t, value in zip(positions, lp, strict=True):
            s.behaviour_logprobs[t] = value
    distill(samples, teacher, coef=1.0)
    assert sum(d * d for s in samples for d in s.dense_advantage) < before


def test_the_tokenizer_check_passes_the_same_tokenizer_and_refuses_another(tiny_model, tiny_full, family_model):
    check_teacher(RunConfig(model=tiny_model, distill={"teacher": tiny_full}))  # same tokenizer files
    with pytest.raises(UsageError, match="another tokenizer than the student"):
        check_teacher(RunConfig(model=tiny_model, distill={"teacher": family_model("llama3")}))
