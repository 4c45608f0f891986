"""What the trainer holds while the engine serves, in the colocated layout (one GPU, the engine asleep during the
update): the plan (`trainer.offload`), the mover that takes tensors to host memory and back in place, the cache
free before the engine wakes, and the peak memory of each phase of a step. Imports only torch (bench/gpu.py loads
this file by itself)."""

from __future__ import annotations

import gc
from collections.abc import Iterable
from typing import Any, Literal

import torch

__all__ = [
    "OffloadPlan", "Offloader", "PhasePeaks", "engine_share", "free_cache", "optimizer_tensors", "resolve_offload",
]  # fmt: skip

OffloadPlan = Literal["none", "optimizer", "all"]


def resolve_offload(
    spec: str, mode: str, sleep_level: int, *, ipc: bool = False, cuda: bool = True, nproc: int = 1
) -> OffloadPlan:
    """`trainer.offload` for this layout. auto: nothing where no engine sleeps (sleep_level 0: the engine never
    hands its memory over, the split layout), on the CPU (no device memory to free) or with nproc > 1 (FSDP2 already
    splits the state N ways); else the optimizer state (12 of full training's 16 bytes per parameter), and the
    weights too for full training at sleep_level 2, where the engine drops its own copy and the GPU is tightest,
    unless they leave by CUDA IPC (the publish reads them on the GPU)."""
    if spec != "auto":
        return spec  # type: ignore[return-value]  # checked by TrainerConfig
    if sleep_level == 0 or not cuda or nproc > 1:
        return "none"
    return "all" if mode == "full" and sleep_level == 2 and not ipc else "optimizer"


HEADROOM = 2**30  # besides the trainer's measured peak: the CUDA context and what NCCL or the allocator add later


def engine_share(trainer_bytes: int, total_bytes: int, headroom_bytes: int = HEADROOM) -> float:
    """The share of a GPU of `total_bytes` a colocated engine that never sleeps can have beside a trainer whose
    measured peak (the allocator's reserved bytes over a step) is `trainer_bytes`: what is left after the trainer
    and `headroom_bytes`, rounded down to 0.01, as vLLM's `gpu_memory_utilization` takes it. Raises ValueError when
    nothing would be left for the engine."""
    share = (total_bytes - trainer_bytes - headroom_bytes) / total_bytes
    if share < 0.05:
        raise ValueError(f"the trainer's peak of {trainer_bytes / 2**30:.1f} GiB leaves the engine "
                         f"{max(share, 0) * 100:.0f} % of this {total_bytes / 2**30:.0f} GiB GPU")  # fmt: skip
    return int(share * 100) / 100


def optimizer_tensors(optimizer: Any) -> list[torch.Tensor]:
    """The optimizer's state tensors (AdamW's moments and step counts), and a MasterWeights' fp32 masters."""
    if isinstance(optimizer, torch.optim.Optimizer):
        masters, inner = [], optimizer
    else:  # a MasterWeights (train/device.py): the AdamW over its masters
        masters, inner = list(optimizer.masters), optimizer.optimizer
    return masters + [t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


class Offloader:
    """Moves tensors to `host` and back in place (`t.data` swapped), so every reference to them (a module's
    parameters, the optimizer's state keyed by them) stays valid. Each goes back to the device it came from.

    Host copies are pinned when CUDA is there (the copies then run asynchronously at full PCIe speed), packed into
    blocks of `block_bytes` (a power of two) or more: torch's pinned allocator rounds every allocation up to a power
    of two, which one allocation per tensor would pay on each: Qwen2.5-7B's fp32 MLP matrices (259 MiB, rounded to
    512) would take about 1.9× the host memory of the state itself."""

    ALIGN = 64  # bytes: every host copy starts here, so a byte block can be viewed as any dtype

    def __init__(self, host: str | torch.device = "cpu", pin: bool | None = None, block_bytes: int = 2**30) -> None:
        self.host = torch.device(host)
        self.pin = (torch.cuda.is_available() if pin is None else pin) and self.host.type == "cpu"
        self.block_bytes = _pow2(block_bytes)
        self.away: list[tuple[torch.Tensor, torch.device]] = []  # (tensor, its home device)

    @property
    def bytes_away(self) -> int:
        return sum(_nbytes(t) for t, _ in self.away)

    @torch.no_grad()
    def offload(self, tensors: Iterable[torch.Tensor]) -> int:
        """Copy each tensor to the host and point it there; a tensor already away (or named twice) moves once.
        Returns the bytes moved."""
        seen, todo = {id(t) for t, _ in self.away}, []
        for t in tensors:
            if id(t) not in seen:
                seen.add(id(t))
                todo.append(t)
        homes = {t.device for t in todo}
        for t, dst in zip(todo, self._host_copies(todo) if todo else [], strict=True):
            dst.copy_(t.data, non_blocking=self.pin)
            self.away.append((t, t.device))
            t.data = dst
        _sync(homes)
        return sum(_nbytes(t) for t in todo)

    def _host_copies(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """An empty host tensor per tensor (its shape and dtype), views into as few blocks as first-fit packing in
        order needs; a block is as large as the largest tensor when that is larger, and the last one only as large
        as (the power of two above) what it holds."""
        cap = max([self.block_bytes, *(_pow2(_nbytes(t)) for t in tensors)])
        places, used = [], [0]  # (block, offset) per tensor; bytes used per block
        for t in tensors:
            n = -(-_nbytes(t) // self.ALIGN) * self.ALIGN
            if used[-1] + n > cap:
                used.append(0)
            places.append((len(used) - 1, used[-1]))
            used[-1] += n
        blocks = [torch.empty(_pow2(u), dtype=torch.uint8, device=self.host, pin_memory=self.pin) for u in used]
        return [
            blocks[b][off : off + _nbytes(t)].view(t.dtype).view(t.shape)
            for t, (b, off) in zip(tensors, places, strict=True)
        ]

    @torch.no_grad()
    def onload(self) -> int:
        """Every tensor back to its home device; the bytes moved."""
        moved, homes = self.bytes_away, {home for _, home in self.away}
        for t, home in self.away:
            t.data = self._copy(t.data, home, self.pin)
        self.away = []
        _sync(homes)
        return moved

    @staticmethod
    def _copy(src: torch.Tensor, device: torch.device, pin: bool) -> torch.Tensor:
        dst = torch.empty(src.shape, dtype=src.dtype, device=device)
        return dst.copy_(src, non_blocking=pin and device.type == "cuda")


def _sync(devices: Iterable[torch.device]) -> None:
    """Non-blocking copies land before anyone reads the host side or the device memory is handed back."""
    for d in devices:
        if d.type == "cuda":
            torch.cuda.synchronize(d)


def free_cache(device: torch.device) -> None:
    """Hand the memory torch's caching allocator keeps on `device` back to the driver (after collecting cycles that
    still hold tensors), so another process (the waking engine) can take it. Nothing to do on the CPU."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


class PhasePeaks:
    """`mem/peak_gib/<phase>`: the most memory this process's torch allocated on the trainer's GPU during one phase
    of a step (rollout: what the trainer kept while the engine served, the engine's own memory not included; update:
    the step and the save; publish). Nothing on the CPU: the OS keeps one high-water mark per process, not one per
    phase, so no number there would be what the name says."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def end(self, phase: str) -> dict[str, float]:
        """This phase's peak, and the next phase starts."""
        if self.device.type != "cuda":
            return {}
        peak = torch.cuda.max_memory_allocated(self.device) / 2**30
        self.start()
        return {f"mem/peak_gib/{phase}": peak}
