"""GPU check: what one accelerator does with the trainer's own pieces and with hrl's Trainer, in about 15 minutes on
one H200.

Phases, each in its own try/except (a failing phase reports its error and the next one runs):
  probe      GPU, versions, bf16 GEMM rate (TFLOP/s, the best of its repetitions)
  lora_step  LoRA (r=16, all projections) step on a Qwen2.5-7B-shape model built from a config (no hub download),
             2 micro-batches × 8192 tokens, activation checkpointing: tokens/s, MFU, peak GiB
  full_step  the same as a full fine-tuning step: bf16 weights, fp32 master weights and AdamW moments
  colocate   the colocated update's memory path on a Qwen2.5-3B shape: a full step, the trainer's offload (weights,
             masters and moments to pinned host memory, cache freed), vLLM's share taken by another process, then
             onload and a second step: GiB moved, seconds, what the trainer keeps, peaks, the state bit for bit
  sync       the weight-sync primitives at 7B size: safetensors save + load to the GPU, the CUDA-IPC copy to a
             second process in packed buckets (the trainer's packer) and one handle per tensor, LoRA adapter bytes
             and load
  publish    the disk tier without vLLM at 7B size: save the weights as the trainer does, load them into a second
             copy of the model in place, compare the two copies' logprobs: seconds, bytes, the largest difference
  tree       tree training on a GRPO-shaped group (8 branches sharing a 6k-token prompt): tokens, step time and
             the largest logprob difference, one row per branch against one packed tree pass; then each pass's
             distance from the same weights in float64 (is the tree within the per-branch pass's own error?)
  fsdp2      hrl's Trainer sharded by FSDP2 on one GPU (a one-rank process group): meta-device build, rows read
             from the safetensors, three bf16 full steps with a trust region, the gathered save, compared weight by
             weight with the same steps in one unsharded process
  embedded   hrl's embedded engine on the GPU (engine_options.device): batched greedy decoding, tokens/s, served
             logprobs against its own teacher-forced score, a full publish into it that changes what it serves
  memory_plan  the colocated plan where vLLM never sleeps: hrl's Trainer's measured peak on --model (a 0.5B shape by
             default) at --plan-tokens a micro-batch, the gpu_memory_utilization left for vLLM
             (`hrl.train.offload.engine_share`), then that share held by another process while the trainer steps
  hrl_trainer  hrl's own Trainer (its pydantic config: the wheelhouse below on a GPU image) on a Qwen2.5-0.5B shape
             saved to disk, bf16: LoRA, then full training with a trust region (max_update_kl), three steps each,
             train/update_norm > 0 at every step; trainer.offload('all'), onload and a fourth step
  lora_variants  the LoRA step three ways side by side: fp32 adapters on all projections (the trainer's), bf16
             adapters, attention projections only (where LoRA's time goes; not in the default run's budget)

MFU is the step's model FLOP/s over the device's peak: the data sheet's dense bf16 figure for a GPU it knows, else
the probe's GEMM rate; with neither (the probe failed), or where the figure would exceed 1 (a peak measured while
the machine was busy), it prints no MFU but says why. Each phase has a time budget on a GPU; --tiny reports the
seconds only (a CI machine's load says nothing about the code).

Output: one JSON line per phase on stdout, then a table. Every phase but hrl's own (hrl_trainer, fsdp2, embedded,
memory_plan) imports only torch,
transformers, peft, safetensors and the standard library (the GPU image has no pydantic or vLLM): the trainer's
device, logprob and offload modules are loaded from their files, so the steps run the trainer's own chunked logprobs,
master-weight AdamW and mover. hrl's own phases import hrl itself: `--pack DIR` builds a wheelhouse (at most 60 MiB) of
what they need beyond the image, which the device run carries and installs first; without it those phases fail saying
so and the others run.

    python bench/gpu.py              # on a GPU machine
    python bench/gpu.py --deadline 480 --out $OUT/gpu.jsonl   # a lease-sized run that keeps what it finished
    python bench/gpu.py --tiny       # the same phases on a tiny config on the CPU (seconds; runs in CI)
    python bench/gpu.py --only memory_plan --model M --plan-tokens 16384   # vLLM's share beside your trainer
    python bench/gpu.py --pack bench/wheelhouse   # here, before a device run; then on the device:
    pip install --no-index --find-links bench/wheelhouse -r bench/wheelhouse/requirements.txt --target /tmp/site &&
      PYTHONPATH=/tmp/site:. python bench/gpu.py --deadline 480 --out $OUT/gpu.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
# dense bf16 TFLOP/s from the data sheets (half the "with sparsity" figure), the first name the GPU's contains
SPEC_TFLOPS = {"H200 NVL": 835.6, "H200": 989.4, "H100 PCIe": 756.5, "H100 NVL": 835.6, "H100": 989.4,
               "A100": 312.0, "L40S": 362.05}  # fmt: skip
GIB = 2**30
ALL_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def sig(x: float, digits: int = 3) -> float:
    """`x` to `digits` significant figures: a rate on a slow CPU stays above 0, one on an H200 keeps no noise."""
    return float(f"{x:.{digits}g}")


def _load(name: str) -> Any:
    """A module of train/ by its file: it imports only torch, so it runs without hrl's other dependencies."""
    spec = importlib.util.spec_from_file_location(f"hrl_bench_{name}", ROOT / "train" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


device_mod, logprobs_mod, offload_mod = _load("device"), _load("logprobs"), _load("offload")
weight_sync_mod = _load("weight_sync")


def _load_tree() -> Any:
    """train/tree.py by its file. Its two hrl imports are served here: the logprob helpers by the logprobs module
    loaded above, the error class by a stand-in (importing hrl would pull in pydantic, absent from the GPU image)."""
    import types

    errors = types.ModuleType("hrl_bench_errors")
    errors.HrlError = type("HrlError", (RuntimeError,), {"__init__": lambda self, msg, hint="": RuntimeError.__init__(self, msg)})  # type: ignore[attr-defined]  # fmt: skip
    saved = {k: sys.modules.get(k) for k in ("hrl.runners.errors", "hrl.train.logprobs")}
    sys.modules["hrl.runners.errors"], sys.modules["hrl.train.logprobs"] = errors, logprobs_mod
    try:
        return _load("tree")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def model_config(tiny: bool, size: str = "7b") -> Any:
    from transformers import Qwen2Config

    if tiny:
        return Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024, tie_word_embeddings=False)  # fmt: skip
    if size == "0.5b":
        return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                           num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                           tie_word_embeddings=True)  # Qwen2.5-0.5B  # fmt: skip
    if size == "3b":
        return Qwen2Config(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                           num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                           tie_word_embeddings=True)  # Qwen2.5-3B  # fmt: skip
    return Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
                       tie_word_embeddings=False)  # Qwen2.5-7B  # fmt: skip


class Bench:
    def __init__(self, tiny: bool, plan_model: str = "", plan_tokens: int = 8192) -> None:
        self.tiny = tiny
        self.plan_model, self.plan_tokens = plan_model, plan_tokens  # the memory plan's model and micro-batch
        self.device = torch.device("cuda" if torch.cuda.is_available() and not tiny else "cpu")
        self.dtype = torch.bfloat16  # on the CPU too: the tiny run takes the same master-weight path as the GPU
        self.tokens = 128 if tiny else 8192  # per micro-batch
        self.micro_batches = 2
        self.gemm_tflops = 0.0
        self.results: list[dict[str, Any]] = []

    # ---- helpers -----------------------------------------------------------------------------------------
    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def peak_gib(self) -> float:
        return round(device_mod.peak_mem_gib(self.device), 2)

    def reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        device_mod.reset_peak_mem(self.device)

    def build(self, size: str = "7b", seed: int = 0) -> Any:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(model_config(self.tiny, size), dtype=self.dtype)
        model.config.use_cache = False
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x; the old name warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model.train()

    def peak_tflops(self) -> tuple[float, str] | None:
        """The device's dense bf16 peak and where it comes from: the data sheet for a GPU named there, else the
        probe's GEMM rate; None when neither is known (the probe failed or did not run)."""
        name = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else ""
        for key, tf in SPEC_TFLOPS.items():
            if key in name:
                return tf, f"{key} spec"
        return (self.gemm_tflops, "measured GEMM") if self.gemm_tflops > 0 else None

    def mfu(self, flops_per_s: float) -> dict[str, Any]:
        """Model FLOP/s over the peak, or no MFU and why: a fraction of a peak is never above 1, so a figure that
        would be says the peak is not this device's (a GEMM timed while the machine was busy)."""
        peak = self.peak_tflops()
        if peak is None:
            return {"mfu_note": "no peak known for this device (the probe measured none)"}
        mfu = flops_per_s / 1e12 / peak[0]
        if mfu > 1:
            return {"mfu_note": f"{sig(mfu)}x the {peak[1]} rate: that rate is not this device's peak"}
        return {"mfu": sig(mfu), "mfu_basis": peak[1]}

    # ---- phases ------------------------------------------------------------------------------------------
    def probe(self) -> dict[str, Any]:
        import peft
        import safetensors
        import transformers

        out: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__,
                               "peft": peft.__version__, "safetensors": safetensors.__version__,
                               "python": platform.python_version(), "device": str(self.device)}  # fmt: skip
        if self.device.type == "cuda":
            p = torch.cuda.get_device_properties(0)
            out |= {"gpu": p.name, "gpu_mem_gib": round(p.total_memory / GIB, 1), "gpus": torch.cuda.device_count(),
                    "cuda": torch.version.cuda}  # fmt: skip
        n = 256 if self.tiny else 8192
        a = torch.randn(n, n, device=self.device, dtype=self.dtype)
        b = torch.randn(n, n, device=self.device, dtype=self.dtype)
        a @ b
        self.sync()
        best = float("inf")
        for _ in range(5):  # the best of 5 timings: a busy moment on a shared machine only makes a timing longer
            t0 = time.perf_counter()
            for _ in range(1 if self.tiny else 10):
                a @ b
            self.sync()
            best = min(best, (time.perf_counter() - t0) / (1 if self.tiny else 10))
        self.gemm_tflops = 2 * n**3 / best / 1e12
        return out | {"gemm_n": n, "gemm_dtype": str(self.dtype).removeprefix("torch."),
                      "gemm_tflops": sig(self.gemm_tflops)}  # fmt: skip

    def _train_step(self, model: Any, optimizer: Any, params: list[torch.nn.Parameter]) -> None:
        """One optimizer step: the trainer's chunked logprobs, a policy-gradient surrogate, accumulation."""
        vocab = model.config.vocab_size
        optimizer.zero_grad(set_to_none=True)
        for k in range(self.micro_batches):
            g = torch.Generator().manual_seed(k)
            ids = torch.randint(0, vocab, (1, self.tokens), generator=g).to(self.device)  # (1, T)
            mask = torch.ones_like(ids)
            logp = logprobs_mod.token_logprobs(model, ids, mask, 512 if not self.tiny else 64).float()  # (1, T-1)
            adv = torch.where(torch.arange(logp.shape[1], device=self.device) % 2 == 0, 1.0, -1.0)
            loss = -(torch.exp(logp - logp.detach()) * adv).mean() / self.micro_batches
            loss.backward()
        # the batch's gradient is where it accumulated: on the params, or on MasterWeights' fp32 masters when that
        # is where backward's hooks move it (clipping skips tensors without a grad)
        torch.nn.utils.clip_grad_norm_([*params, *getattr(optimizer, "masters", [])], 1.0)
        optimizer.step()

    def _step_phase(
        self, lora: bool, targets: tuple[str, ...] = ALL_PROJ, fp32_adapters: bool = True
    ) -> dict[str, Any]:
        self.reset_peak()
        model = self.build()
        if lora:
            from peft import LoraConfig, get_peft_model

            config = LoraConfig(r=16, lora_alpha=32, target_modules=list(targets))
            model = get_peft_model(model, config, autocast_adapter_dtype=fp32_adapters)  # True: peft's default
        params = [p for p in model.parameters() if p.requires_grad]
        n_total = sum(p.numel() for p in model.parameters())
        n_matmul = n_total - model.get_input_embeddings().weight.numel()  # a lookup, not a matmul
        low = any(p.dtype != torch.float32 for p in params)
        optimizer = device_mod.MasterWeights(params, lr=1e-6) if low else torch.optim.AdamW(params, lr=1e-6)
        self._train_step(model, optimizer, params)  # warm-up: kernels, allocator, optimizer state
        self.sync()
        t0 = time.perf_counter()
        self._train_step(model, optimizer, params)
        self.sync()
        dt = time.perf_counter() - t0
        cfg, tokens = model_config(self.tiny), self.tokens * self.micro_batches
        # model FLOPs per token (N: matmul weights, the input embedding left out): 2N forward, 2N input grads, 2N
        # weight grads (full only; LoRA's are negligible), plus attention scores
        # (PaLM's 12·L·H·T for forward + backward); recomputation under checkpointing is not counted (MFU, not HFU)
        per_token = (6 if not lora else 4) * n_matmul + 12 * cfg.num_hidden_layers * cfg.hidden_size * self.tokens
        out = {"params_b": round(n_total / 1e9, 3), "trainable_m": round(sum(p.numel() for p in params) / 1e6, 2),
               "tokens": tokens, "step_s": round(dt, 3), "tokens_per_s": round(tokens / dt, 1),
               **self.mfu(per_token * tokens / dt), "peak_gib": self.peak_gib()}  # fmt: skip
        del model, optimizer, params
        self.reset_peak()
        return out

    def _hrl_batch(self, vocab: int, n: int, half: int) -> list[Any]:
        """`n` samples for hrl's Trainer: `half` prompt tokens then `half` sampled ones, advantages ±1."""
        Sample = _hrl("hrl.train.samples").Sample
        gen = torch.Generator().manual_seed(0)
        return [Sample(f"t{i}", "g", ["a"], torch.randint(0, vocab, (2 * half,), generator=gen).tolist(),
                       [0] * half + [1] * half, [0.0] * half + [-1.0] * half, [-1] * half + [0] * half,
                       [0.0] * half + [1 / half] * half, advantage=1.0 if i % 2 else -1.0)
                for i in range(n)]  # fmt: skip

    def _hrl_model(self, folder: str, size: str = "0.5b", seed: int = 0) -> Any:
        """A model of `size` (tiny with --tiny) saved to `folder` as a user's is; its config."""
        model = self.build(size, seed=seed)
        model.save_pretrained(folder)
        config = model.config
        del model
        return config

    def _hrl_trainer(self, folder: str, **settings: Any) -> Any:
        trainer = _hrl("hrl.train.trainer")
        settings = {"dtype": "bfloat16", "device": str(self.device), "micro_batch": 2} | settings
        return trainer.Trainer(trainer.TrainerConfig(model=folder, **settings))

    def hrl_trainer(self) -> dict[str, Any]:
        """hrl's own Trainer (`hrl.train.trainer`, its pydantic config and samples: on a GPU image, the wheelhouse
        `--pack` builds) on a model saved to disk as a user's is, in bf16: LoRA, then full training with a trust
        region (`trainer.max_update_kl`, which once left bf16 weights unmoved), three steps each, `train/update_norm`
        > 0 at every step; then the colocated update's path (`trainer.offload('all')`: weights, fp32 masters and
        moments to host memory, the cache freed; onload) and a fourth step."""
        n, half = (4, self.tokens // 2) if self.tiny else (4, 1024)
        out: dict[str, Any] = {"model": "tiny" if self.tiny else "0.5b", "samples": n, "tokens": n * 2 * half}
        with tempfile.TemporaryDirectory() as d:
            batch = self._hrl_batch(self._hrl_model(d).vocab_size, n, half)
            for mode, lr, bound in (("lora", 1e-4, 0.0), ("full", 1e-6, 0.5)):
                self.reset_peak()
                trainer = self._hrl_trainer(d, mode=mode, lr=lr, max_update_kl=bound)
                t0 = time.perf_counter()
                norms = [trainer.step(batch)["train/update_norm"] for _ in range(3)]
                self.sync()
                out[f"{mode}_step_s"] = round((time.perf_counter() - t0) / 3, 3)
                out[f"{mode}_update_norms"] = [sig(x) for x in norms]
                if not all(x > 0 for x in norms):
                    raise AssertionError(f"{mode}: a step moved nothing (train/update_norm {norms})")
                if mode == "full":
                    moved = trainer.offload("all")
                    trainer.onload()
                    after = trainer.step(batch)["train/update_norm"]
                    out |= {"offload_gib": sig(moved["offload/gib"]), "offload_s": round(moved["offload/seconds"], 3),
                            "update_norm_after_onload": sig(after)}  # fmt: skip
                    if not after > 0:
                        raise AssertionError("the step after offload and onload moved nothing")
                out[f"{mode}_peak_gib"] = self.peak_gib()
                del trainer
        self.reset_peak()
        return out

    def fsdp2(self) -> dict[str, Any]:
        """hrl's Trainer sharded with FSDP2 on one GPU (a process group of one rank: NCCL on a GPU, gloo on the CPU):
        the meta-device build, each rank reading its rows of the safetensors, fp32 shards as bf16 training's masters,
        full training with a trust region for three steps (`train/update_norm` > 0 each), the gathered save; then the
        same three steps in one unsharded process, and the two saved checkpoints compared weight by weight."""
        import socket

        import torch.distributed as dist
        from safetensors.torch import load_file

        n, half = (4, self.tokens // 2) if self.tiny else (4, 1024)
        out: dict[str, Any] = {"model": "tiny" if self.tiny else "0.5b", "samples": n, "tokens": n * 2 * half}
        with tempfile.TemporaryDirectory() as d:
            batch = self._hrl_batch(self._hrl_model(f"{d}/start").vocab_size, n, half)
            saved = {}
            for kind in ("sharded", "whole"):
                self.reset_peak()
                if kind == "sharded":
                    with socket.socket() as sock:
                        sock.bind(("127.0.0.1", 0))
                        port = sock.getsockname()[1]
                    dist.init_process_group("nccl" if self.cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                            rank=0, world_size=1, **({"device_id": self.device} if self.cuda else {}))  # fmt: skip
                try:
                    trainer = self._hrl_trainer(f"{d}/start", mode="full", lr=1e-5, max_update_kl=0.5)
                    if trainer.distributed != (kind == "sharded"):
                        raise AssertionError(f"{kind}: the trainer's distributed flag is {trainer.distributed}")
                    t0 = time.perf_counter()
                    norms = [trainer.step(batch)["train/update_norm"] for _ in range(3)]
                    self.sync()
                    out[f"{kind}_step_s"] = round((time.perf_counter() - t0) / 3, 3)
                    out[f"{kind}_update_norms"] = [sig(x) for x in norms]
                    out[f"{kind}_peak_gib"] = self.peak_gib()
                    if not all(x > 0 for x in norms):
                        raise AssertionError(f"{kind}: a step moved nothing (train/update_norm {norms})")
                    trainer.save(f"{d}/{kind}")
                    del trainer
                finally:
                    if dist.is_initialized():
                        dist.destroy_process_group()
                saved[kind] = {k: v for f in sorted(Path(f"{d}/{kind}").glob("*.safetensors"))
                               for k, v in load_file(str(f)).items()}  # fmt: skip
            start = {
                k: v for f in sorted(Path(f"{d}/start").glob("*.safetensors")) for k, v in load_file(str(f)).items()
            }
        if saved["sharded"].keys() != saved["whole"].keys():
            raise AssertionError(
                f"the sharded save has other weights: {saved['sharded'].keys() ^ saved['whole'].keys()}"
            )
        diff = max(float((saved["sharded"][k].float() - saved["whole"][k].float()).abs().max()) for k in start)
        moved = max(float((saved["whole"][k].float() - start[k].float()).abs().max()) for k in start)
        out |= {"max_abs_dw_sharded_vs_whole": sig(diff), "max_abs_dw_whole_vs_start": sig(moved)}
        if not diff <= moved:  # the two runs apart by more than training moved either: not the same update
            raise AssertionError(f"sharded and whole training differ by {diff}, training moved the weights {moved}")
        self.reset_peak()
        return out

    def embedded(self) -> dict[str, Any]:
        """hrl's embedded engine on this device (`engine_options.device`): greedy and seeded requests batched, a
        full publish into it between two requests (the served tokens change, their version is 1), and the served
        logprobs against the engine's own teacher-forced score of the same tokens."""
        import asyncio

        engines = _hrl("hrl.runners.engines")
        n_new = 16 if self.tiny else 128

        async def go(start: str, other: str) -> dict[str, Any]:
            engine = engines.make_engine("embedded", start, dtype="bfloat16", device=str(self.device))
            await engine.start()
            try:
                gen = torch.Generator().manual_seed(0)
                prompts = [torch.randint(0, 500, (32,), generator=gen).tolist() for _ in range(4)]
                greedy = engines.SamplingParams(max_tokens=n_new, temperature=0.0, ignore_eos=True)
                t0 = time.perf_counter()
                runs = await asyncio.gather(*(engines.collect(engine.generate(f"r{i}", p, greedy))
                                              for i, p in enumerate(prompts)))  # fmt: skip
                took = time.perf_counter() - t0
                scored = await engine.score(prompts[0], runs[0].token_ids)
                t0 = time.perf_counter()
                await engine.publish(other, "full")
                publish_s = time.perf_counter() - t0
                after = await engines.collect(engine.generate("after", prompts[0], greedy))
                on = next(engine.model.parameters()).device
                return {"engine_device": str(on), "tokens_per_s": sig(len(prompts) * n_new / took),
                        "max_abs_dlogp_served_vs_scored": sig(max(abs(a - b) for a, b in zip(runs[0].logprobs, scored, strict=True))),
                        "publish_s": round(publish_s, 3), "version_after": engine.version,
                        "versions_after": after.versions, "changed_by_publish": after.token_ids != runs[0].token_ids}  # fmt: skip
            finally:
                await engine.close()

        with tempfile.TemporaryDirectory() as d:
            self._hrl_model(f"{d}/a")
            self._hrl_model(f"{d}/b", seed=1)
            out = asyncio.run(go(f"{d}/a", f"{d}/b"))
        if out["engine_device"].split(":")[0] != self.device.type or out["version_after"] != 1:
            raise AssertionError(f"the engine ran on {out['engine_device']} at version {out['version_after']}")
        if not out["changed_by_publish"]:
            raise AssertionError("the publish did not change the served tokens")
        return out

    def memory_plan(self) -> dict[str, Any]:
        """The colocated memory plan where the engine never sleeps: hrl's Trainer (full, bf16, no offload: what
        sleep_level 0 keeps) steps on micro-batches of --plan-tokens on the model of --model (a Qwen2.5-0.5B shape
        by default), its peak reserved memory is the trainer's need, and `engine_share` turns it into the
        `engine_options.gpu_memory_utilization` vLLM can have. Then another process takes that share while the
        trainer steps again: the plan holds if the second step runs beside it."""
        offload = _hrl("hrl.train.offload")
        n, half = 2, (self.tokens // 2 if self.tiny else self.plan_tokens // 2)
        with tempfile.TemporaryDirectory() as d:
            folder = self.plan_model or f"{d}/m"
            vocab = _model_vocab(folder) if self.plan_model else self._hrl_model(folder).vocab_size
            batch = self._hrl_batch(vocab, n, half)
            self.reset_peak()
            trainer = self._hrl_trainer(folder, mode="full", lr=1e-6, max_update_kl=0.5, micro_batch=1)
            trainer.step(batch)
            self.sync()
            out: dict[str, Any] = {"model": self.plan_model or ("tiny" if self.tiny else "0.5b"),
                                   "micro_batch_tokens": 2 * half}  # fmt: skip
            if self.cuda:
                need = torch.cuda.max_memory_reserved(self.device)
                total = torch.cuda.get_device_properties(self.device).total_memory
                share = offload.engine_share(need, total)
                nbytes = int(share * total)
                out |= {"trainer_need_gib": round(need / GIB, 2), "gpu_gib": round(total / GIB, 1),
                        "gpu_memory_utilization": share}  # fmt: skip
            else:  # the path runs; the figures are a GPU's
                nbytes = 1 << 20
            with _share_held(nbytes, str(self.device)) as got:  # the engine's share, held while the trainer steps
                out["share_ok"] = got == nbytes
                if got != nbytes:
                    raise AssertionError(f"the engine's share could not be taken beside the trainer: {got}")
                norm = trainer.step(batch)["train/update_norm"]
                self.sync()
            out["step_beside_share_update_norm"] = sig(norm)
            del trainer
        self.reset_peak()
        return out

    def lora_step(self) -> dict[str, Any]:
        return self._step_phase(lora=True)

    def full_step(self) -> dict[str, Any]:
        return self._step_phase(lora=False)

    def lora_variants(self) -> dict[str, Any]:
        """Where LoRA's step time goes, side by side on one model shape: as the trainer runs it (fp32 adapters on all
        seven projections, peft's default), with the adapters in bf16, and on the attention projections only."""
        out: dict[str, Any] = {}
        for name, kwargs in (("fp32_all", {}), ("bf16_all", {"fp32_adapters": False}),
                             ("fp32_attn", {"targets": ("q_proj", "k_proj", "v_proj", "o_proj")})):  # fmt: skip
            row = self._step_phase(lora=True, **kwargs)
            out |= {f"{name}_step_s": row["step_s"], f"{name}_trainable_m": row["trainable_m"]}
            out |= {f"{name}_peak_gib": row["peak_gib"]} if "peak_gib" in row else {}
        return out

    def colocate(self) -> dict[str, Any]:
        """One GPU, vLLM asleep during the update: a full step, then what the trainer does before vLLM wakes
        (`trainer.offload: all`: weights, fp32 masters and AdamW moments to pinned host memory, the allocator's cache
        back to the driver), vLLM's share taken by another process meanwhile, then onload and a second step. The
        state is compared bit for bit (every 4096th element of each tensor) across the round trip."""
        self.reset_peak()
        model = self.build("3b")
        params = list(model.parameters())
        optimizer = device_mod.MasterWeights(params, lr=1e-6)
        self._train_step(model, optimizer, params)
        self.sync()
        out: dict[str, Any] = {"params": sum(p.numel() for p in params), "param_tensors": len(params)}
        out |= self._cuda_gib(step1_peak_gib=self.peak_gib())
        optimizer.zero_grad(set_to_none=True)
        state = [*params, *offload_mod.optimizer_tensors(optimizer)]
        marks = _marks(state)
        mover = offload_mod.Offloader("cpu")
        t0 = time.perf_counter()
        moved = mover.offload(state)
        offload_mod.free_cache(self.device)
        out |= {"offload_bytes": moved, "offload_s": round(time.perf_counter() - t0, 2)}
        out |= self._cuda_gib(trainer_reserved_gib=torch.cuda.memory_reserved(self.device) / GIB if self.cuda else 0)
        out |= self._take_share(moved)
        t0 = time.perf_counter()
        mover.onload()
        out["onload_s"] = round(time.perf_counter() - t0, 2)
        out["state_equal"] = all(torch.equal(a, b) for a, b in zip(marks, _marks(state), strict=True))
        device_mod.reset_peak_mem(self.device)
        self._train_step(model, optimizer, params)
        self.sync()
        out |= self._cuda_gib(step2_peak_gib=self.peak_gib())
        # the next update's round trip: the host blocks the first offload pinned are cached by torch and reused,
        # which is what every update after the first pays
        optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        mover.offload(state)
        offload_mod.free_cache(self.device)
        out["offload2_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        mover.onload()
        out["onload2_s"] = round(time.perf_counter() - t0, 2)
        del model, optimizer, params, state, mover
        if self.cuda and hasattr(torch._C, "_host_emptyCache"):  # the pinned blocks, cached for the next offload
            torch._C._host_emptyCache()
        self.reset_peak()
        return out

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def _cuda_gib(self, **figures: float) -> dict[str, float]:
        """GPU memory figures, rounded; none on the CPU (the process's RSS is not what these names say)."""
        return {k: round(v, 2) for k, v in figures.items()} if self.cuda else {}

    def _take_share(self, moved: int) -> dict[str, Any]:
        """vLLM waking beside the offloaded trainer: another process allocates and touches its share (on a GPU,
        VLLM_SHARE of the device's memory; on the CPU, as many bytes as the offload moved, so the path runs)."""
        import torch.multiprocessing as mp

        total = torch.cuda.get_device_properties(self.device).total_memory if self.cuda else 0
        share = int(VLLM_SHARE * total) if self.cuda else moved
        out = self._cuda_gib(free_gib=torch.cuda.mem_get_info(self.device)[0] / GIB if self.cuda else 0)
        acks = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(target=_hold_share, args=(share, str(self.device), acks), daemon=True)
        proc.start()
        got = acks.get(timeout=300)
        proc.join(60)
        return out | {"share_bytes": share, "share_ok": got == share} | ({"share_error": got} if got != share else {})

    def publish(self) -> dict[str, Any]:
        """The disk tier without vLLM: the weights saved as the trainer saves them (HF safetensors), loaded in place
        into a second copy of the model built with other weights (as vLLM's reload_weights does), then both copies'
        logprobs on the same tokens: equal to the last bit when every weight arrived."""
        from safetensors.torch import load_file

        self.reset_peak()
        model, other = self.build().eval(), self.build(seed=1).eval()
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size, (1, self.tokens), generator=g).to(self.device)  # (1, T)
        chunk = 64 if self.tiny else 512
        with torch.no_grad():
            want = logprobs_mod.token_logprobs(model, ids, torch.ones_like(ids), chunk).float()
            before = logprobs_mod.token_logprobs(other, ids, torch.ones_like(ids), chunk).float()
        out: dict[str, Any] = {"max_abs_dlogp_before": sig(float((want - before).abs().max()))}
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            model.save_pretrained(tmp, safe_serialization=True)
            out["save_s"] = round(time.perf_counter() - t0, 2)
            files = sorted(Path(tmp).glob("*.safetensors"))
            out["bytes"] = sum(f.stat().st_size for f in files)
            t0, loaded = time.perf_counter(), set()
            for f in files:
                part = load_file(str(f), device=str(self.device))
                other.load_state_dict(part, strict=False)
                loaded |= part.keys()
                del part
            self.sync()
            out["load_s"] = round(time.perf_counter() - t0, 2)
        out["keys_missing"] = len(set(other.state_dict()) - loaded)
        with torch.no_grad():
            got = logprobs_mod.token_logprobs(other, ids, torch.ones_like(ids), chunk).float()
        out["max_abs_dlogp"] = float((want - got).abs().max())
        del model, other
        self.reset_peak()
        return out

    def sync_phase(self) -> dict[str, Any]:
        from safetensors.torch import load_file, save_file

        self.reset_peak()
        with torch.device(self.device):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_config(model_config(self.tiny), dtype=self.dtype)
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        out: dict[str, Any] = {"weights_gib": round(nbytes / GIB, 2)}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.safetensors"
            t0 = time.perf_counter()
            save_file({k: v.cpu() for k, v in state.items()}, str(path))
            out["save_s"] = round(time.perf_counter() - t0, 2)
            t0 = time.perf_counter()
            loaded = load_file(str(path), device=str(self.device))
            self.sync()
            out["load_s"] = round(time.perf_counter() - t0, 2)
            assert loaded.keys() == state.keys()
            del loaded
        out |= self._ipc(state, nbytes)
        del state
        out |= self._adapter(model)
        del model
        self.reset_peak()
        return out

    def _ipc(self, state: dict[str, torch.Tensor], nbytes: int) -> dict[str, Any]:
        """The colocated full-weight sync path, both ways `weight_sync: ipc` sends: packed buckets (the trainer's own
        packer, train/weight_sync.py, at the default `ipc_bucket_mb` 512: one buffer, refilled once the receiver has
        answered for the previous bucket) and one CUDA-IPC handle per tensor (`ipc_bucket_mb: 0`). A second process
        (an inference engine's worker in a real colocated run) copies each into its own buffer and acknowledges.
        On the CPU the tensors travel by shared memory, each a copy: --tiny's seconds say nothing."""
        import torch.multiprocessing as mp

        bucket = 2**16 if self.tiny else 512 * 2**20  # bytes; --tiny's weights fill a few 64 KiB buckets
        named, cpu = list(state.items()), self.device.type != "cuda"
        ctx = mp.get_context("spawn")
        jobs, acks = ctx.Queue(), ctx.Queue()
        proc = ctx.Process(target=_receiver, args=(jobs, acks, str(self.device)), daemon=True)
        proc.start()
        assert acks.get(timeout=120) == "ready"
        t0, sent, buckets = time.perf_counter(), 0, 0
        buf = torch.empty(weight_sync_mod.buffer_bytes(named, bucket), dtype=torch.uint8, device=self.device)
        for meta in weight_sync_mod.pack_buckets(named, bucket, buf):  # synchronises before it yields
            fill = sum(meta["tensor_sizes"])
            jobs.put(buf[:fill].clone() if cpu else buf[:fill])
            sent, buckets = sent + acks.get(timeout=300), buckets + 1
        packed_s = time.perf_counter() - t0
        del buf
        t0 = time.perf_counter()
        for t in state.values():  # all handles at once, as the unpacked update sends them in one request
            jobs.put(t.clone() if cpu else t)
        per_tensor = sum(acks.get(timeout=300) for _ in state)
        per_tensor_s = time.perf_counter() - t0
        jobs.put(None)
        proc.join(60)
        assert sent == per_tensor == nbytes, (sent, per_tensor, nbytes)
        return {"ipc_bucket_mib": bucket / 2**20, "ipc_buckets": buckets, "ipc_s": round(packed_s, 2),
                "ipc_gib_per_s": sig(nbytes / GIB / packed_s), "ipc_tensors": len(state),
                "ipc_per_tensor_s": round(per_tensor_s, 2), "ipc_per_tensor_gib_per_s": sig(nbytes / GIB / per_tensor_s),
                "ipc_packed_speedup": sig(per_tensor_s / packed_s)}  # fmt: skip

    def _adapter(self, model: Any) -> dict[str, Any]:
        from peft import LoraConfig, get_peft_model
        from safetensors.torch import load_file

        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        peft_model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=targets))
        with tempfile.TemporaryDirectory() as tmp:
            peft_model.save_pretrained(tmp)
            f = Path(tmp) / "adapter_model.safetensors"
            t0 = time.perf_counter()
            tensors = load_file(str(f), device=str(self.device))
            self.sync()
            return {"adapter_mib": round(f.stat().st_size / 2**20, 1), "adapter_tensors": len(tensors),
                    "adapter_load_s": round(time.perf_counter() - t0, 3)}  # fmt: skip

    def tree(self) -> dict[str, Any]:
        """A GRPO group of 8 sharing one long prompt: forward + backward of every branch as its own row, against one
        packed pass over the prefix tree (the trainer's `trainer.tree`); both on the LoRA model."""
        from peft import LoraConfig, get_peft_model

        tree_mod = _load_tree()
        self.reset_peak()
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = get_peft_model(self.build(), LoraConfig(r=16, lora_alpha=32, target_modules=targets))
        prompt_len, completion_len, branches = (96, 32, 8) if self.tiny else (6144, 1024, 8)
        g = torch.Generator().manual_seed(0)
        vocab = model.config.vocab_size
        prompt = torch.randint(0, vocab, (prompt_len,), generator=g).tolist()
        seqs = [prompt + torch.randint(0, vocab, (completion_len,), generator=g).tolist() for _ in range(branches)]
        chunk = 64 if self.tiny else 512

        def per_branch() -> list[torch.Tensor]:
            out = []
            for s in seqs:
                ids = torch.tensor([s], device=self.device)
                logp = logprobs_mod.token_logprobs(model, ids, torch.ones_like(ids), chunk)[0].float()
                (-logp.mean() / branches).backward()
                out.append(logp.detach())
            return out

        def packed() -> list[torch.Tensor]:
            logps = [lp.float() for lp in tree_mod.tree_logprobs(model, seqs, chunk)]
            sum(-lp.mean() / branches for lp in logps).backward()
            return [lp.detach() for lp in logps]

        row: dict[str, Any] = {"branches": branches, "prompt_tokens": prompt_len,
                               "branch_tokens": sum(len(s) for s in seqs),
                               "tree_tokens": tree_mod.distinct_tokens(seqs)}  # fmt: skip
        for name, fn in (("branch", per_branch), ("tree", packed)):
            fn()  # warm-up
            model.zero_grad(set_to_none=True)
            self.sync()
            t0 = time.perf_counter()
            got = fn()
            self.sync()
            row[f"{name}_step_s"] = round(time.perf_counter() - t0, 3)
            row[f"{name}_peak_gib"] = self.peak_gib()
            if name == "branch":
                reference = got
            model.zero_grad(set_to_none=True)
        row["time_ratio"] = round(row["tree_step_s"] / row["branch_step_s"], 3)
        diffs = torch.cat([(a - b).abs().flatten() for a, b in zip(reference, got, strict=True)])
        row["max_abs_dlogp"] = sig(float(diffs.max()))
        row["mean_abs_dlogp"] = sig(float(diffs.mean()))
        # how far each pass is from the exact logprobs of these very weights (float64, one branch at a time): the
        # tree earns its place where it is no further than the per-branch pass it replaces
        model.to(torch.float64)
        with torch.no_grad():
            exact = [logprobs_mod.token_logprobs(model, ids, torch.ones_like(ids), chunk)[0].double()
                     for ids in (torch.tensor([s], device=self.device) for s in seqs)]  # fmt: skip
        for name, logps in (("branch", reference), ("tree", got)):
            d = torch.cat([(a.double() - e).abs().flatten() for a, e in zip(logps, exact, strict=True)])
            row[f"{name}_vs_f64_max"], row[f"{name}_vs_f64_mean"] = sig(float(d.max())), sig(float(d.mean()))
        del exact
        self.reset_peak()
        return row


def _marks(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every 4096th element of each tensor (all of a small one), on the CPU: a cheap bitwise fingerprint."""
    return [t.detach().flatten()[:: max(1, t.numel() // 4096)].cpu() for t in tensors]


def _hold_share(nbytes: int, device: str, acks: Any, release: Any = None) -> None:
    """The waking engine's side of the colocate phase: allocate its share, touch every byte, report the bytes (or
    why not: an out-of-memory error is the finding), let go (when `release` has something: the memory plan's
    trainer steps in the meantime)."""
    try:
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        block.fill_(1)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        acks.put(block.numel())
    except Exception as e:  # reported, not raised: the parent's row says what failed
        acks.put(f"{type(e).__name__}: {e}"[:300])
        return
    if release is not None:
        release.get(timeout=600)


@contextlib.contextmanager
def _share_held(nbytes: int, device: str) -> Iterator[Any]:
    """Another process holds `nbytes` of `device` (an engine's share) for the block; yields what it reported: the
    bytes, or its error."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    acks, release = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_hold_share, args=(nbytes, device, acks, release), daemon=True)
    proc.start()
    try:
        yield acks.get(timeout=300)
    finally:
        release.put(True)
        proc.join(60)


def _model_vocab(folder: str) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(folder).get_text_config().vocab_size)


def _hrl(module: str) -> Any:
    """A module of hrl itself; on a GPU image without its pure-Python dependencies, an error saying how to bring
    them (the wheelhouse of `--pack`)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise RuntimeError(f"hrl cannot be imported here ({e}): build the wheelhouse with `python bench/gpu.py "
                           "--pack DIR` and install it before the run (this file's docstring)") from e  # fmt: skip


def _receiver(jobs: Any, acks: Any, device: str) -> None:
    """The other side of the IPC copy (an inference engine's worker in a real colocated run)."""
    dest = None
    acks.put("ready")
    while (t := jobs.get()) is not None:
        t = t.reshape(-1).view(torch.uint8)  # a bucket already is; a tensor of the per-tensor path becomes its bytes
        if dest is None or dest.numel() < t.numel():
            dest = torch.empty(t.numel(), dtype=torch.uint8, device=device)
        dest[: t.numel()].copy_(t)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        n = t.numel()
        del t
        acks.put(n)


@contextlib.contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Raise TimeoutError in the main thread when a phase runs past its budget."""

    def over(signum: int, frame: Any) -> None:
        raise TimeoutError(f"phase ran past its {seconds:.0f} s budget")

    old = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_phase(
    bench: Bench, name: str, fn: Callable[[], dict[str, Any]], budget_s: float, out: Path | None = None
) -> dict[str, Any]:
    """Run one phase under its time budget (a GPU run: the budgets are sized for an H200's work); --tiny's phases
    run unbounded, their seconds reported (the CI test bounds the whole run). Each row is also appended to `out` as
    it ends, so a run stopped from outside keeps the phases it finished."""
    t0 = time.perf_counter()
    try:
        if budget_s <= 0:
            raise TimeoutError("no time left before the run's deadline")
        with contextlib.nullcontext() if bench.tiny else time_budget(budget_s):
            row = {"phase": name, "ok": True, **fn()}
    except Exception as e:  # a phase fails alone; the next one runs
        row = {"phase": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:500],
               "where": traceback.format_exc().strip().splitlines()[-3][:200]}  # fmt: skip
    row["seconds"] = round(time.perf_counter() - t0, 2)
    bench.results.append(row)
    print(json.dumps(row), flush=True)
    if out is not None:
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| phase | ok | s | figures |", "|---|---|---|---|"]
    for r in rows:
        figures = ", ".join(f"{k}={v}" for k, v in r.items() if k not in {"phase", "ok", "seconds"})
        lines.append(f"| {r['phase']} | {'yes' if r['ok'] else 'NO'} | {r['seconds']} | {figures} |")
    return "\n".join(lines)


# budgets add up to 910 s without lora_variants (run it with --only); a shorter lease passes --deadline, which cuts
# each phase to what is left. In the order of what a short device lease should measure first: hrl's own trainer, the
# weight-sync buckets, the LoRA step, then the phases that need the most memory and time (the 7B full step is the one
# most likely not to fit)
PHASES = [("probe", "probe", 25), ("hrl_trainer", "hrl_trainer", 90), ("fsdp2", "fsdp2", 75),
          ("embedded", "embedded", 60), ("memory_plan", "memory_plan", 60), ("sync", "sync_phase", 100),
          ("lora_step", "lora_step", 75), ("tree", "tree", 60), ("colocate", "colocate", 150),
          ("publish", "publish", 120), ("full_step", "full_step", 95), ("lora_variants", "lora_variants", 120)]  # fmt: skip
ON_REQUEST = {"lora_variants"}  # run only when named in --only
VLLM_SHARE = 0.8  # of the GPU's memory: what vLLM takes back while the offloaded trainer holds next to nothing


# what the GPU image imports, so has: its packages and what they load (the model, tokenizer and hub paths included)
IMAGE_MODULES = ("torch", "transformers", "peft", "safetensors.torch", "huggingface_hub.file_download",
                 "transformers.models.qwen2.modeling_qwen2", "transformers.models.auto.tokenization_auto")  # fmt: skip
PACK_ANYWAY = {"typing-extensions"}  # pydantic needs a newer one than an image may hold
PACK_MODULES = (
    "hrl.train.trainer",
    "hrl.train.samples",
    "hrl.runners.engines",
)  # what the phases that run hrl itself import
PACK_PYTHONS = ("3.10", "3.11", "3.12", "3.13")  # the image's Python is one of these; a wheel each where built
PACK_LIMIT = 60 * 2**20
_CLOSURE = """
import importlib, importlib.metadata as md, json, sys
before = set(sys.modules)
for name in sys.argv[1:]:
    importlib.import_module(name)
dists = md.packages_distributions()
found = {d for m in set(sys.modules) - before for d in dists.get(m.split(".")[0], [])}
print(json.dumps(sorted((d, md.version(d)) for d in found)))
"""


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def closure(modules: tuple[str, ...]) -> list[tuple[str, str]]:
    """The distributions (name, version) importing `modules` loads in this environment, from a fresh interpreter."""
    import subprocess

    probe = subprocess.run([sys.executable, "-c", _CLOSURE, *modules], capture_output=True, text=True, cwd=ROOT)
    if probe.returncode:
        raise SystemExit(f"importing {modules} failed here:\n{probe.stderr[-2000:]}")
    return [tuple(pair) for pair in json.loads(probe.stdout)]


def image_dists() -> set[str]:
    """The distributions the GPU image has, by normalised name: those importing IMAGE_MODULES loads here."""
    return {_norm(d) for d, _ in closure(IMAGE_MODULES)}


def pack(dest: Path) -> dict[str, Any]:
    """A wheelhouse of what hrl's own phases import beyond the GPU image (the distributions PACK_MODULES load here
    that `image_dists` does not hold,
    at this environment's versions), as wheels for each Python in PACK_PYTHONS (manylinux x86_64 where the wheel is
    built, else the pure one), with a requirements.txt; at most PACK_LIMIT bytes. On the device, before the run:
    `pip install --no-index --find-links DIR -r DIR/requirements.txt --target SITE` and `PYTHONPATH=SITE:.`."""
    import subprocess

    image = image_dists() - PACK_ANYWAY
    wanted = [(d, v) for d, v in closure(PACK_MODULES) if _norm(d) not in image and _norm(d) != "hrl"]
    if not any(_norm(d) == "pydantic" for d, _ in wanted):  # the image has none (measured on the device)
        raise SystemExit(f"pydantic is not among the packed distributions {wanted}: this environment's image "
                         "modules import it, which the GPU image cannot")  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    for py in PACK_PYTHONS:  # one pip per Python: a pure wheel is fetched once, a built one per ABI
        tag = py.replace(".", "")
        got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                              "--dest", str(dest), "--python-version", py, "--implementation", "cp",
                              "--abi", f"cp{tag}", "--abi", "abi3", "--abi", "none",
                              "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
                              "--platform", "manylinux2014_x86_64", "--platform", "any",
                              *(f"{d}=={v}" for d, v in wanted)], capture_output=True, text=True)  # fmt: skip
        if got.returncode:
            raise SystemExit(f"pip download for Python {py} failed:\n{got.stderr[-2000:]}")
    (dest / "requirements.txt").write_text("".join(f"{d}=={v}\n" for d, v in wanted))
    wheels = sorted(dest.glob("*.whl"))
    size = sum(w.stat().st_size for w in wheels)
    if size > PACK_LIMIT:
        raise SystemExit(f"the wheelhouse is {size / 2**20:.1f} MiB, over {PACK_LIMIT / 2**20:.0f} MiB: {wheels}")
    return {"dir": str(dest), "distributions": [f"{d}=={v}" for d, v in wanted], "wheels": len(wheels),
            "mib": round(size / 2**20, 2)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny config on the CPU (the CI run)")
    ap.add_argument("--only", nargs="*", default=None, help="run only these phases")
    ap.add_argument("--out", type=Path, default=None, help="append each phase's JSON row to this file as it ends")
    ap.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds for the whole run: a phase's budget is cut to what is left, minus 10 s",
    )
    ap.add_argument("--model", default="", help="memory_plan: the model folder to plan for (default: a Qwen2.5-0.5B "
                    "shape built here)")  # fmt: skip
    ap.add_argument("--plan-tokens", type=int, default=8192,
                    help="memory_plan: the tokens of the longest micro-batch the run will train on")  # fmt: skip
    ap.add_argument("--pack", type=Path, default=None, metavar="DIR",
                    help="build the wheelhouse of hrl's dependencies the GPU image lacks into DIR, then stop")  # fmt: skip
    a = ap.parse_args(argv)
    if a.pack is not None:
        print(json.dumps(pack(a.pack)), flush=True)
        return 0
    bench, start = Bench(a.tiny, a.model, a.plan_tokens), time.perf_counter()
    for name, method, budget in PHASES:
        if (name in a.only) if a.only is not None else name not in ON_REQUEST:
            if a.deadline is not None:
                budget = min(budget, a.deadline - (time.perf_counter() - start) - 10)
            run_phase(bench, name, getattr(bench, method), budget, a.out)
    print(table(bench.results), flush=True)
    if a.out is not None:
        a.out.with_suffix(".md").write_text(table(bench.results) + "\n")
    return 0 if all(r["ok"] for r in bench.results) else 1


if __name__ == "__main__":
    sys.exit(main())
