"""The model a trainer updates, built for one process or for a rank of a sharded (FSDP2) job, and the module its
logprobs come through (`LogprobModel`: padded rows, or one prefix-tree pass)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from hrl.config import TrainerConfig
from hrl.runners.engines.images import model_has_vision
from hrl.runners.errors import HrlError
from hrl.runners.models import peft_quietly
from hrl.train import distributed
from hrl.train.logprobs import token_logprobs
from hrl.train.tree import tree_logprobs

__all__ = ["LogprobModel", "build_policy"]


class LogprobModel(torch.nn.Module):
    """A causal LM whose forward returns token_logprobs: one root module for FSDP2, whose forward hooks then cover
    the embeddings and the head that token_logprobs calls apart from the backbone."""

    def __init__(self, model: Any, chunk: int = 512) -> None:
        super().__init__()
        self.inner, self.chunk = model, chunk

    def forward(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        tree: list[list[int]] | None = None,
        pixels: dict[str, torch.Tensor] | None = None,
    ) -> torch.Tensor | list[torch.Tensor]:
        """(B, T-1) logprobs of padded rows (with `pixels`: their images' pixel inputs); or with `tree`, per
        sequence (T_s-1,) from one packed prefix-trie pass."""
        if tree is not None:
            return tree_logprobs(self.inner, tree, self.chunk)
        return token_logprobs(self.inner, input_ids, attention_mask, self.chunk, pixels)


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
