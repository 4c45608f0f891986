"""The model a trainer updates, built for one process or for a rank of a sharded (FSDP2) job."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from hrl.runners.engines.images import model_has_vision
from hrl.runners.errors import HrlError
from hrl.runners.models import peft_quietly
from hrl.train import distributed
from hrl.train.logprobs import LogprobModel
from hrl.train.trainer_config import TrainerConfig

__all__ = ["build_policy"]


def build_policy(
    cfg: TrainerConfig, path: str | Path, device: torch.device, dtype: torch.dtype, sharded: bool,
    trainable: bool = True,
) -> tuple[torch.nn.Module, LogprobModel]:  # fmt: skip
    """The policy (HF or peft model, and the LogprobModel around it that FSDP2 shards) or, not `trainable`, a frozen
    copy of the starting weights. One process loads the checkpoint onto its device. Sharded, no rank ever holds the
    whole model: built on the meta device, sharded, then each rank reads only its shards' rows. bf16 full fine-tuning
    keeps its shards in fp32 (the masters; gradients reduced and accumulated in fp32) and computes in bf16, as one
    process does with MasterWeights. A vision-language model (`vision_config` in its config.json) loads whole, its
    vision tower and connector with the LM, in one process only."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision = model_has_vision(str(path))
    if vision and sharded:
        raise HrlError("a vision-language model trains in one trainer process (FSDP2 sharding would run its vision "
                       "tower on some ranks only)", hint="use -c trainer.nproc=1")  # fmt: skip
    mixed = sharded and trainable and cfg.mode == "full" and dtype != torch.float32
    if sharded:
        model = distributed.empty_model(path, torch.float32 if mixed else dtype)
    else:
        auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM  # vision: tower, connector, LM
        model = auto.from_pretrained(path, dtype=dtype).to(device)
    model.config.use_cache = False
    if not trainable:
        model = model.eval().requires_grad_(False)
    elif cfg.gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers ≥ 5.2x; the old name warns
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    adapters: dict[str, torch.Tensor] = {}
    if trainable and cfg.mode == "lora":
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=cfg.lora_targets)
        with peft_quietly(), torch.device("meta") if sharded else contextlib.nullcontext():
            # float32: the adapters in fp32 whatever the base dtype (peft's default); model: in the weights' dtype
            model = get_peft_model(model, lora, autocast_adapter_dtype=cfg.lora_dtype == "float32")
        adapters = distributed.fresh_adapters(model, cfg.seed)  # the same start for any number of ranks
    forward = LogprobModel(model.train() if trainable else model, cfg.logprob_chunk)
    if sharded:
        distributed.shard(forward, model, param_dtype=dtype if mixed else None)
        distributed.load_shards(forward, model, path, device, dtype, adapters)
    else:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name in adapters:
                    p.copy_(adapters[name])
    return model, forward
