"""Many trainer processes (torchrun): each rank holds a shard of the weights (FSDP2 `fully_shard`) and runs its
share of the micro-batches; the gradient reduce-scatter sums them. NCCL on GPUs, gloo on the CPU.

No rank ever holds the whole model: it is built on the meta device, sharded, and each rank then reads only its
rows of every weight from the checkpoint's safetensors (`load_shards`)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from hrl.runners.errors import HrlError

__all__ = [
    "all_reduce",
    "empty_model",
    "fresh_adapters",
    "full_state_dict",
    "init_from_env",
    "is_main",
    "load_shards",
    "on_device",
    "on_own_device",
    "shard",
    "world",
]


def world() -> tuple[int, int]:
    """(rank, world size); (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return world()[0] == 0


def on_device(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Make `device` the current CUDA device of the calling thread. torch keeps the current device per thread, and
    FSDP2 places its shards, streams and buffers on it: every thread that runs a rank's CUDA work enters this."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


_T = TypeVar("_T")


def on_own_device(method: Callable[..., _T]) -> Callable[..., _T]:
    """A method of an object with a `device` (the Trainer), run with that device current in the calling thread: the
    loop calls the trainer from worker threads, whose current device is cuda:0 whatever the rank's GPU is."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> _T:
        with on_device(self.device):
            return method(self, *args, **kwargs)

    return run


def init_from_env(device: torch.device) -> bool:
    """Join the torchrun job named by the environment (WORLD_SIZE > 1); True when in one, or when the caller already
    set up a process group (of any size: one rank is FSDP2 on one GPU, as bench/gpu.py's fsdp2 phase runs it). NCCL's
    group is bound to the rank's own GPU (`device_id`), whichever thread runs the collectives later."""
    if dist.is_available() and dist.is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not dist.is_initialized():
        if device.type == "cuda":
            with on_device(device):
                dist.init_process_group("nccl", device_id=device)
        else:
            dist.init_process_group("gloo")
    return True


SHARDED_TRANSFORMERS = 5  # the first major release whose _init_weights recomputes rotary buffers after a meta load


def empty_model(path: str | Path, dtype: torch.dtype) -> torch.nn.Module:
    """The HF model of `path` with every parameter and buffer on the meta device: no memory, no weights read.
    Refused on transformers before 5: its initialiser leaves non-persistent buffers (rotary inv_freq) as the
    uninitialised memory `to_empty` gives, so every rank would train on a wrong position encoding without a word."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    from hrl.runners.errors import PrerequisiteError

    if int(transformers.__version__.split(".")[0]) < SHARDED_TRANSFORMERS:
        raise PrerequisiteError(
            f"sharded training (trainer.nproc > 1) needs transformers >= {SHARDED_TRANSFORMERS}, found "
            f"{transformers.__version__}: older releases leave the rotary buffers uninitialised after the meta load",
            hint="pip install -U 'transformers>=5', or train in one process (-c trainer.nproc=1)",
        )
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=dtype)


def shard(module: torch.nn.Module, inner: Any, param_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """FSDP2: one group per decoder layer of `inner` (the HF or peft model), the rest (embeddings, norm, head) in
    the root group of `module`, the wrapper whose forward runs the whole model. Reduce-scatter averages gradients
    over the ranks, so each rank scales its loss (normalised over the whole batch) by the world size.

    `param_dtype` (bf16 full fine-tuning): the shards stay in their own dtype (fp32: they are the master weights),
    forwards run on `param_dtype` copies, and gradients are reduced and accumulated over micro-batches in fp32."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32 if param_dtype else None)
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    for layer in base.base_model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(module, mp_policy=mp)
    return module


def fresh_adapters(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Starting values of the LoRA adapters, full size on the CPU, drawn from `seed` alone (peft's default init:
    A Kaiming-uniform, B zero), so one process and every rank of a sharded trainer start from the same ones."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, p in model.named_parameters():
        if "lora_A" in name:
            out[name] = torch.nn.init.kaiming_uniform_(torch.empty(p.shape), a=math.sqrt(5), generator=gen)
        elif "lora_B" in name:
            out[name] = torch.zeros(p.shape)
    return out


def _checkpoint_key(name: str) -> str:
    """A parameter's name in the HF checkpoint: without the wrapper's `inner.`, peft's prefix and `base_layer`."""
    return name.removeprefix("inner.").removeprefix("base_model.model.").replace(".base_layer.", ".")


@contextlib.contextmanager
def _checkpoint(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every tensor of the checkpoint's safetensors files, by name, as a lazy slice (nothing read yet)."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise HrlError(
            f"no *.safetensors in {path}: a sharded trainer reads each rank's rows of the weights from them",
            hint="save the model with save_pretrained(safe_serialization=True), or use -c trainer.nproc=1",
        )
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(safe_open(str(f), framework="pt", device="cpu")) for f in files]
        yield {k: h.get_slice(k) for h in handles for k in h.keys()}  # noqa: SIM118 (safe_open has no __iter__)


def _fill(p: torch.Tensor, rows: Any, dtype: torch.dtype | None = None) -> None:
    """Copy this rank's part of a tensor into p's local shard: `rows` is a full tensor or a safetensors slice, read
    only where this rank's shard lies; rounded to `dtype` on the way when given."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = p.to_local() if isinstance(p, DTensor) else p
    if isinstance(p, DTensor):
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    else:
        shape, offset = tuple(p.shape), (0,) * p.dim()
    if local.numel():
        part = rows[tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))]
        local.copy_(part.to(dtype) if dtype is not None else part)


@torch.no_grad()
def load_shards(
    module: torch.nn.Module,
    inner: Any,
    path: str | Path,
    device: torch.device,
    dtype: torch.dtype,
    given: dict[str, torch.Tensor],
) -> None:
    """Materialise a meta-built, sharded `module` on `device`: each rank allocates its shards and reads only their
    rows from the checkpoint, rounded to `dtype` as one process loads them (fp32 shards of a bf16 run start from the
    bf16 weights); `given` (by parameter name, e.g. fresh LoRA adapters) fills the rest as they are. Non-persistent
    buffers (rotary inv_freq) are recomputed by the model's own initialiser, as HF does after its meta-device load."""
    module.to_empty(device=device)
    base = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
    tied = base.all_tied_weights_keys or {}  # e.g. lm_head.weight → model.embed_tokens.weight
    aliases = {**tied, **{v: k for k, v in tied.items()}}
    with _checkpoint(path) as stored:
        for name, b in module.named_buffers():  # first: an initialiser that also touches weights is overwritten below
            if (key := _checkpoint_key(name)) in stored:
                _fill(b, _stored(stored, key, b, path))
            else:
                base._init_weights(module.get_submodule(name.rpartition(".")[0]))  # e.g. rotary, from the config
        for name, p in module.named_parameters():
            key = _checkpoint_key(name)
            if name.removeprefix("inner.") in given:
                _fill(p, given[name.removeprefix("inner.")])
            elif key in stored or aliases.get(key) in stored:
                _fill(p, _stored(stored, key if key in stored else aliases[key], p, path), dtype)
            else:
                raise HrlError(
                    f"{key} is not in the checkpoint at {path}: a sharded trainer reads the weights by the "
                    "model's own names",
                    hint=_NAMES_HINT,
                )


_NAMES_HINT = "re-save the model with save_pretrained (one process converts older layouts), or use -c trainer.nproc=1"


def _stored(stored: dict[str, Any], key: str, p: torch.Tensor, path: str | Path) -> Any:
    if tuple(stored[key].get_shape()) != tuple(p.shape):
        raise HrlError(
            f"{key} is {stored[key].get_shape()} in {path} but {list(p.shape)} in the model", hint=_NAMES_HINT
        )
    return stored[key]


def all_reduce(values: list[float], device: torch.device, op: str = "sum") -> list[float]:
    """Element-wise sum (or max) of a list of floats over the ranks; the list itself outside a process group. The
    values travel on `device`, the rank's own (NCCL reduces on GPUs only)."""
    if world()[1] == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return t.cpu().tolist()


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded weights on the CPU (every rank takes part; rank 0 gets them, the others an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
