"""On-policy distillation (`distill:`): a frozen teacher scores every token the student sampled, and the per-token
reverse KL estimate enters the loss as a dense advantage.

For a token y_t the student sampled after the prefix y_<t, log π_student(y_t) − log π_teacher(y_t) is the one-sample
(k1) estimate of KL(π_student ‖ π_teacher) at that position (Agarwal et al. 2024, GKD; Thinking Machines, "On-Policy
Distillation", 2025). Its negative, × `distill.coef`, is added to the token's advantage: a token the teacher finds
likelier than the student did is pushed up. The student's logprob is the one the engine recorded when it sampled the
token (the trace's), so the teacher needs one prefill per sample and the student none. With `train.advantage:
distill` the trace's own advantage is 0 and this term is the whole signal; with any other kind it is added to it.

The teacher runs after a batch's rollouts end and before the update, on the trainer's device and in its dtype,
samples padded into forward passes of at most `distill.batch_tokens` tokens; or, given as a running vLLM server's
URL, on that server (`RemoteTeacher`: one `prompt_logprobs` request a sample). Its tokenizer is checked to be the
student's before anything starts (`hrl.runners.preflight.check_teacher`): ids are scored as they are, never re-
tokenized. A sample whose prompt holds images is left without the term (the teacher gets no pixels), counted.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hrl.config import DistillConfig, LoopConfig
from hrl.runners.models import peft_quietly, split_adapter
from hrl.train.device import plan_micro_batches
from hrl.train.logprobs import token_logprobs
from hrl.train.samples import Sample

__all__ = ["RemoteTeacher", "Teacher", "distill", "start_teacher"]


class Teacher:
    """A frozen causal LM (an HF model, or a LoRA checkpoint merged into its base) that prefills samples."""

    def __init__(self, cfg: DistillConfig, device: torch.device, dtype: torch.dtype, chunk: int = 512) -> None:
        from transformers import AutoModelForCausalLM

        base, adapter = split_adapter(cfg.teacher)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
        if adapter:
            from peft import PeftModel

            with peft_quietly():
                model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        self.model = model.to(device).eval().requires_grad_(False)
        self.device, self.batch_tokens, self.chunk = device, cfg.batch_tokens, chunk

    @torch.no_grad()
    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """Per sample, per position t: log π_teacher(input_ids[t] | input_ids[:t]) in fp32; 0.0 at t = 0 (no prefix)."""
        out: list[list[float]] = [[] for _ in samples]
        for mb in plan_micro_batches([len(s.input_ids) for s in samples], 1, self.batch_tokens):
            width = max(len(samples[i].input_ids) for i in mb)
            ids = torch.zeros((len(mb), width), dtype=torch.long)  # (B, T) right-padded
            mask = torch.zeros((len(mb), width), dtype=torch.long)
            for row, i in enumerate(mb):
                n = len(samples[i].input_ids)
                ids[row, :n], mask[row, :n] = torch.tensor(samples[i].input_ids), 1
            lp = token_logprobs(self.model, ids.to(self.device), mask.to(self.device), self.chunk)  # (B, T-1)
            for row, i in enumerate(mb):
                out[i] = [0.0, *lp[row, : len(samples[i].input_ids) - 1].float().cpu().tolist()]
        return out


class RemoteTeacher(Teacher):
    """A running vLLM server that scores samples over HTTP (`distill.teacher: URL`): one `prompt_logprobs` request a
    sample, `distill.concurrency` at once (`hrl.runners.engines.scoring`). The server's own dtype and kernels are
    the teacher's."""

    def __init__(self, cfg: DistillConfig) -> None:  # nothing is loaded here: the server holds the model
        from hrl.runners.engines.scoring import ScoringServer

        self.server = ScoringServer(cfg.teacher, cfg.teacher_model, cfg.concurrency)

    def logprobs(self, samples: list[Sample]) -> list[list[float]]:
        """As `Teacher.logprobs`: per sample, per position t, log π_teacher(input_ids[t] | input_ids[:t]); 0.0 at 0."""
        return self.server.score([s.input_ids for s in samples])


def start_teacher(cfg: LoopConfig, trainer: Any) -> Teacher | None:
    """The run's teacher: a server's URL scores over HTTP; a model is loaded on the trainer's device and in its dtype
    (`trainer.logprob_chunk` positions per vocabulary chunk); None without `distill.teacher`. Both loops call it
    once, after `start_trainer`."""
    if not cfg.distill.enabled:
        return None
    if cfg.distill.remote:
        return RemoteTeacher(cfg.distill)
    return Teacher(cfg.distill, trainer.device, trainer.dtype, cfg.trainer.logprob_chunk)


def distill(samples: list[Sample], teacher: Teacher, coef: float) -> dict[str, float]:
    """Set each sample's `dense_advantage`: −coef × (log π_student − log π_teacher) on its loss tokens, 0 elsewhere.
    Metrics: `distill/reverse_kl`, the mean of log π_student − log π_teacher over the batch's distinct loss tokens (a
    token shared by several branches of a trace counts once); `distill/tokens`, how many; `distill/image_samples`,
    samples left without the term; `time/distill_s`, the teacher's time."""
    t0 = time.monotonic()
    scored = [s for s in samples if s.loss_tokens and not s.media]
    per_token: dict[tuple[str, int], float] = {}  # (trace, the token's prefix hash) → student − teacher
    for s, teacher_lp in zip(scored, teacher.logprobs(scored), strict=True):
        s.dense_advantage, prefix = [0.0] * len(s.input_ids), 0
        for t, (tok, m) in enumerate(zip(s.input_ids, s.loss_mask, strict=True)):
            prefix = hash((prefix, tok))  # a token is the same token in two branches iff its whole prefix is
            if m and t > 0:
                kl = s.behaviour_logprobs[t] - teacher_lp[t]
                s.dense_advantage[t] = -coef * kl
                per_token[(s.trace_id, prefix)] = kl
    return {
        "distill/reverse_kl": sum(per_token.values()) / max(len(per_token), 1),
        "distill/tokens": float(len(per_token)),
        "distill/image_samples": float(sum(bool(s.media) for s in samples if s.loss_tokens)),
        "time/distill_s": time.monotonic() - t0,
    }
