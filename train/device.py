"""Where the trainer runs and what it holds: device and dtype resolution, fp32 master weights for low-precision
training, micro-batches by a token budget, and the peak memory of a step."""

from __future__ import annotations

import functools
import random
import re
import resource
import sys
from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "MasterWeights",
    "peak_mem_gib",
    "plan_micro_batches",
    "reset_peak_mem",
    "resolve_device",
    "resolve_dtype",
    "split_mini_batches",
]

_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


def resolve_device(spec: str, local_rank: int | None = None, gpus: Sequence[int] = ()) -> torch.device:
    """auto: the GPU when there is one, else the CPU. A bare `cuda` is the rank's own: gpus[LOCAL_RANK] when the
    trainer's GPUs are listed (the split layout), else cuda:LOCAL_RANK."""
    if not _DEVICE.fullmatch(spec):
        raise ValueError(f"trainer.device must be auto, cpu, cuda or cuda:N, not {spec!r}")
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"trainer.device={spec} but torch sees no CUDA device (torch {torch.__version__})")
    if spec == "cuda":
        rank = local_rank or 0
        if gpus and rank >= len(gpus):
            raise ValueError(f"trainer rank {rank} has no GPU in trainer.gpus={list(gpus)}: list one per rank")
        spec = f"cuda:{gpus[rank] if gpus else rank}"
    return torch.device(spec)


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 weights on a GPU, float32 on the CPU (where bf16 matmuls are slow and logprobs drift)."""
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, spec)


def reset_peak_mem(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_mem_gib(device: torch.device) -> float:
    """CUDA: the most memory torch allocated on the device since the last reset_peak_mem (one step). CPU: the
    process's peak resident set size so far (the OS keeps one high-water mark, so it never falls between steps)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / (2**30 if sys.platform == "darwin" else 2**20)


def release_free_memory() -> None:
    """Hand what the C allocator holds free back to the OS (glibc's malloc_trim; elsewhere nothing): a trainer
    step's activations freed on the CPU otherwise stay resident, charged to the process, beside the engine's."""
    if trim := _malloc_trim():
        trim(0)


@functools.cache
def _malloc_trim() -> Any:
    """glibc's malloc_trim, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def plan_micro_batches(lengths: Sequence[int], count: int, tokens: int = 0) -> list[list[int]]:
    """Indices of each micro-batch. tokens = 0: `count` samples each, in order. tokens > 0: samples sorted by length
    and packed while the padded size (samples × longest) stays within `tokens`; a longer sample goes alone."""
    if tokens <= 0:
        return [list(range(i, min(i + count, len(lengths)))) for i in range(0, len(lengths), count)]
    plan: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j]):
        if plan and (len(plan[-1]) + 1) * lengths[i] <= tokens:
            plan[-1].append(i)
        else:
            plan.append([i])
    return plan


def split_mini_batches(
    samples: Sequence[Any], n: int, shuffle: bool, seed: int, step: int, epoch: int
) -> list[list[int]]:
    """Sample indices of `n` mini-batches of whole traces (a trace's branches share its unit weight), traces in
    order, or shuffled by (seed, step, epoch) when a batch takes several optimizer steps."""
    traces = list(dict.fromkeys(s.trace_id for s in samples))
    if shuffle:
        random.Random(seed * 1_000_003 + step * 101 + epoch).shuffle(traces)
    n = max(1, min(n, len(traces)))
    groups = [traces[i * len(traces) // n : (i + 1) * len(traces) // n] for i in range(n)]
    return [[i for i, s in enumerate(samples) if s.trace_id in set(g)] for g in groups]


class MasterWeights:
    """AdamW over fp32 master copies of low-precision (bf16) trainable weights: the optimizer state and the update
    stay in fp32, the model keeps (and computes with) the rounded weights. Gradients accumulate in fp32 too: right
    after backward adds a micro-batch's bf16 gradient to a weight, it moves into the master's fp32 grad (and the bf16
    one is freed), so a batch's gradient is never a bf16 running sum. The masters' grads are what to clip."""

    def __init__(self, params: Iterable[torch.nn.Parameter], **adamw: float) -> None:
        self.params = list(params)
        self.masters = [p.detach().float().clone() for p in self.params]
        self.optimizer = torch.optim.AdamW(self.masters, foreach=False, **adamw)
        for p, m in zip(self.params, self.masters, strict=True):
            p.register_post_accumulate_grad_hook(functools.partial(_accumulate, m))

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p, m in zip(self.params, self.masters, strict=True):
            p.grad, m.grad = None, None

    @torch.no_grad()
    def step(self) -> None:
        """AdamW on the masters (one without a grad is skipped), then the model takes their rounded values."""
        self.optimizer.step()
        for m in self.masters:
            m.grad = None
        self.sync_to_model()

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        """Masters restart from the (loaded) model weights; the moments come back in fp32."""
        self.sync_from_model()
        self.optimizer.load_state_dict(state)

    @torch.no_grad()
    def sync_to_model(self) -> None:
        """The model's weights := the masters' rounded values (after a step, or the masters set from outside)."""
        for p, m in zip(self.params, self.masters, strict=True):
            p.copy_(m)

    @torch.no_grad()
    def sync_from_model(self) -> None:
        """Masters := the model's weights (after they were set from outside: a load, a scaled-back step)."""
        for p, m in zip(self.params, self.masters, strict=True):
            m.copy_(p)


@torch.no_grad()
def _accumulate(master: torch.Tensor, p: torch.Tensor) -> None:
    """p.grad (this micro-batch's, low precision) into master.grad (fp32, the batch's sum so far)."""
    if master.grad is None:
        master.grad = p.grad.to(torch.float32, copy=True)
    else:
        master.grad.add_(p.grad)
    p.grad = None
