"""A sharded trainer (FSDP2 over 2 gloo processes on the CPU) starts without any rank holding the whole model and
takes the same step as one process: the same gradients and updated weights to 1e-6, the same HF / peft checkpoint,
and it resumes from it. No CUDA call in the trainer or the runners leans on the thread's current device."""

from __future__ import annotations

import ast
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from hrl.train.trainer import Trainer, TrainerConfig
from tests.train.test_trainer import _batch


def _batch4() -> list:
    return _batch([1.0, -1.0, 0.5, -0.5, 1.0], distinct=True)  # 5 micro-batches of 1: rank 1 runs a padding one


class _Allocations(TorchDispatchMode):
    """Bytes of every new storage that torch ops create off the meta device (a view, an in-place result or anything
    else sharing an input's storage is not new; a DTensor counts its local shard's): an upper bound on what a rank
    held at once, since freed tensors count too. What safetensors returns is not an op result and goes uncounted: the
    loader asks it for a shard's rows only (`get_slice`), never a whole weight."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes, self.largest = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {_storage(t).data_ptr() for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta" and _storage(t).data_ptr() not in seen:
                seen.add(_storage(t).data_ptr())
                self.bytes += _storage(t).nbytes()
                self.largest = max(self.largest, _storage(t).nbytes())
        return out


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    return (t.to_local() if hasattr(t, "to_local") else t).untyped_storage()


def _held(trainer: Trainer) -> list[int]:
    """[elements of the weights this process holds (its shards when sharded), elements of the whole model, bytes of
    the whole model's weights and buffers]: tied weights once, LoRA adapters included."""
    params, buffers = list(trainer.forward.parameters()), list(trainer.forward.buffers())
    local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
    return [sum(t.numel() for t in local), sum(p.numel() for p in params),
            sum(t.numel() * t.element_size() for t in [*params, *buffers])]  # fmt: skip


def _step(cfg: TrainerConfig, out: Path) -> dict[str, torch.Tensor]:
    """One step; the full gradient (gathered when sharded), saved to out/ with the checkpoint; what the trainer
    holds after init and what it allocated on the way."""
    registered = [0]  # the most elements of a real (not meta) weight any module was given, its local shard if sharded

    def seen(module: torch.nn.Module, name: str, p: torch.Tensor | None) -> None:
        local = p.to_local() if hasattr(p, "to_local") else p
        if local is not None and local.device.type != "meta":
            registered[0] = max(registered[0], local.numel())

    hook = torch.nn.modules.module.register_module_parameter_registration_hook(seen)
    with _Allocations() as allocated:
        trainer = Trainer(cfg)
    hook.remove()
    held = torch.tensor([*_held(trainer), allocated.bytes, registered[0]])
    grads: list[torch.Tensor] = []
    opt_step = trainer.optimizer.step

    def keep() -> None:  # the gradient where it accumulated: the fp32 masters' under MasterWeights
        holders = getattr(trainer.optimizer, "masters", None) or trainer._trainable()
        full = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad for p in holders]
        grads.append(torch.cat([g.flatten() for g in full]))
        opt_step()

    trainer.optimizer.step = keep
    metrics = trainer.step(_batch4())
    trainer.save(out)
    resumed = Trainer(cfg)
    resumed.load(out)
    after = [(p.full_tensor() if hasattr(p, "full_tensor") else p).float() for p in resumed._trainable()]
    return {"grad": grads[0], "loss": torch.tensor(metrics["train/loss"]), "resumed": torch.cat([a.detach().flatten() for a in after]),
            "steps": torch.tensor(resumed.steps), "held": held,
            "fp32_shards": torch.tensor([p.dtype == torch.float32 for p in trainer._trainable()]).all()}  # fmt: skip


def _worker(rank: int, world: int, port: int, cfg: TrainerConfig, out: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})  # fmt: skip
    torch.set_num_threads(1)
    result = _step(cfg, Path(out) / "ckpt")
    torch.save(result, Path(out) / f"result{rank}.pt")
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(ckpt: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v for f in sorted(ckpt.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_two_gloo_ranks_take_the_single_process_step(tiny_model, tmp_path, mode):
    # Adam's first step is lr × g/(|g| + ε): on a gradient near 0 a 1e-9 difference moves the update by up to lr/10,
    # so lr stays small enough for the 1e-6 bound while the step still moves every weight with a gradient by ~lr
    cfg = TrainerConfig(model=tiny_model, mode=mode, lr=3e-5, micro_batch=1, device="cpu")
    single = _step(cfg, tmp_path / "single")
    mp.start_processes(_worker, (2, _free_port(), cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    sharded, other = torch.load(tmp_path / "result0.pt"), torch.load(tmp_path / "result1.pt")
    # init: each rank holds its FSDP2 rows of every weight, ceil(rows / 2) at most, and the two shares add up to the
    # model. What torch ops allocated on a rank on the way, freed tensors included, adds up to less than the model's
    # bytes, so it never held the whole model at once; no module of a rank was ever given a real weight bigger than
    # the biggest weight's shard, so the biggest (the embedding) was never whole on it, as it is in one process.
    (mine, whole, whole_bytes, total0, big0), (theirs, *_, total1, big1) = (
        sharded["held"].tolist(),
        other["held"].tolist(),
    )
    fresh = Trainer(cfg)
    shards = [-(-p.shape[0] // 2) * p[0].numel() if p.dim() else 0 for p in fresh.forward.parameters()]
    assert mine + theirs == whole == single["held"][1] == single["held"][0]
    assert max(mine, theirs) <= sum(shards) < 0.51 * whole
    assert max(total0, total1) < whole_bytes
    assert max(big0, big1) <= max(shards) < max(p.numel() for p in fresh.forward.parameters()) == single["held"][4]
    assert single["grad"].abs().max() > 1e-4
    torch.testing.assert_close(sharded["grad"], single["grad"], rtol=0, atol=1e-6)
    torch.testing.assert_close(sharded["loss"], single["loss"], rtol=0, atol=1e-6)
    one, two = _weights(tmp_path / "single"), _weights(tmp_path / "ckpt")
    assert one.keys() == two.keys() and one
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=1e-6)
    assert (tmp_path / "ckpt" / ("adapter_config.json" if mode == "lora" else "config.json")).is_file()
    torch.testing.assert_close(sharded["resumed"], single["resumed"], rtol=0, atol=1e-6)
    start = torch.cat([p.detach().flatten() for p in fresh._trainable()])
    assert (single["resumed"] - start).abs().max() > 2e-5  # the step really moved the weights  # --resume: same weights
    assert int(sharded["steps"]) == int(single["steps"]) == 1


def _thread_device_calls(source: str) -> list[str]:
    """CUDA calls that land on the calling thread's current device (cuda:0 in a worker thread, whatever the rank's
    GPU): `.cuda()`, `.to("cuda")`, `torch.device("cuda")`, `device="cuda"`, `torch.cuda.current_device()`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        strings = [a.value for a in node.args if isinstance(a, ast.Constant)]
        if (
            (name == "cuda" and isinstance(node.func, ast.Attribute) and not node.args and not node.keywords)
            or (name == "to" and "cuda" in strings)
            or (name == "device" and strings == ["cuda"] and len(node.args) == 1)  # torch.device("cuda", i) is fine
            or any(
                k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "cuda"
                for k in node.keywords
            )
            or name == "current_device"
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_trainer_and_runners_name_their_gpu_in_every_cuda_call():
    bad = ['t.cuda()', 'x.to("cuda")', 'torch.device("cuda")', 'torch.zeros(1, device="cuda")',
           'torch.cuda.current_device()']  # fmt: skip
    assert [len(_thread_device_calls(s)) for s in bad] == [1] * len(bad)
    ok = ['t.cuda(dev)', 'x.to(dev)', 'torch.device("cuda", 1)', 'torch.device("cuda:1")', 'd.type == "cuda"',
          'torch.zeros(1, device=dev)', 'torch.cuda.device(dev)']  # fmt: skip
    assert [_thread_device_calls(s) for s in ok] == [[]] * len(ok)
    root = Path(__file__).resolve().parents[2]
    found = {str(f.relative_to(root)): calls for d in ("train", "runners") for f in sorted((root / d).rglob("*.py"))
             if (calls := _thread_device_calls(f.read_text()))}  # fmt: skip
    assert found == {}


def test_two_gloo_ranks_train_bf16_on_fp32_shards_like_one_process(tiny_model, tmp_path):
    # bf16 full fine-tuning: one process computes with bf16 weights and keeps fp32 masters (MasterWeights); sharded,
    # the fp32 shards are the masters and FSDP2 computes on bf16 copies. Both accumulate the bf16 micro-batch
    # gradients in fp32, in another order, so the masters differ by fp32 roundings and the bf16 weights they round to
    # by at most one bf16 step: 2^-7 of the weight (8 significant bits). lr 1e-3 moves most bf16 weights.
    cfg = TrainerConfig(model=tiny_model, mode="full", dtype="bfloat16", lr=1e-3, micro_batch=1, device="cpu")
    single = _step(cfg, tmp_path / "single")
    mp.start_processes(_worker, (2, _free_port(), cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    sharded = torch.load(tmp_path / "result0.pt")
    assert bool(sharded["fp32_shards"]) and not bool(single["fp32_shards"])  # one process: bf16 weights, fp32 masters
    assert sharded["grad"].dtype == single["grad"].dtype == torch.float32
    torch.testing.assert_close(sharded["loss"], single["loss"], rtol=0, atol=1e-6)
    one, two = _weights(tmp_path / "single"), _weights(tmp_path / "ckpt")
    assert one.keys() == two.keys() and {v.dtype for v in two.values()} == {torch.bfloat16}
    start = _weights(Path(tiny_model))
    moved = sum(int((one[k].float() != start[k].to(torch.bfloat16).float()).sum()) for k in one)
    assert moved > 0.5 * sum(v.numel() for v in one.values())
    for k in one:
        assert ((two[k].float() - one[k].float()).abs() <= 2**-7 * one[k].float().abs()).all(), k
    torch.testing.assert_close(sharded["resumed"], single["resumed"], rtol=2**-7, atol=0)


def test_sharded_training_is_refused_on_transformers_before_5(tiny_model, monkeypatch):
    """Before transformers 5 the meta-device load leaves rotary inv_freq as uninitialised memory: refused, naming the
    version and what to do, before any weight is read."""
    import transformers

    from hrl.runners.errors import PrerequisiteError
    from hrl.train.distributed import empty_model

    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    with pytest.raises(PrerequisiteError, match=r"transformers >= 5, found 4\.57\.1") as info:
        empty_model(tiny_model, torch.float32)
    assert "trainer.nproc=1" in info.value.hint
    monkeypatch.undo()
    assert empty_model(tiny_model, torch.float32).model.rotary_emb.inv_freq.is_meta
