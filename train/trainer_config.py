"""`TrainerConfig`: the `trainer:` section of a recipe (what `-c trainer.KEY=VALUE` sets), apart from the trainer
that reads it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["TrainerConfig"]

_ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TrainerConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    model: str = Field(description="HF model id or local dir to train.")
    mode: Literal["lora", "full"] = Field("lora", description="LoRA adapters (peft) or all weights.")
    lora_rank: int = Field(8, ge=1, description="LoRA rank r of every adapted projection.")
    lora_alpha: int = Field(16, ge=1, description="LoRA scale numerator: the update is (alpha / r) · B A.")
    lora_targets: list[str] = Field(default_factory=lambda: list(_ALL_PROJ))
    lora_dtype: Literal["float32", "model"] = Field(
        "float32",
        description="The LoRA adapters' own dtype: float32 (peft's default: the adapters' matmuls in fp32), or model "
        "(the weights' dtype, bfloat16 on a GPU, as vLLM runs them; the optimizer keeps fp32 master copies). On one "
        "H200, a 7B LoRA step took 1.93 s with model against 2.57 s with float32 (docs/training-on-gpus.md).",
    )
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, ge=0, description="Global grad-norm clip; 0 = off.")
    micro_batch: int = Field(4, ge=1, description="Samples per forward/backward (gradient accumulation over the rest).")
    micro_batch_tokens: int = Field(
        0,
        ge=0,
        description="Token budget per forward/backward instead of a count: samples sorted by length are packed "
        "while samples × longest ≤ this (a longer one goes alone). 0 = use micro_batch.",
    )
    device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto = the GPU when there is one.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Weights and compute dtype; auto = bfloat16 on a GPU, float32 on the CPU. With bfloat16, "
        "optimizer state stays fp32 (LoRA adapters are fp32 unless lora_dtype: model; bf16 weights get fp32 master "
        "copies), as do the loss and logprobs.",
    )
    nproc: int = Field(
        1,
        ge=1,
        description="Trainer processes (FSDP2 shards, NCCL on GPUs, gloo on the CPU): rank 0 in the loop's process, "
        "the others spawned with torchrun's environment. On GPUs, one per visible device.",
    )
    gpus: list[int] = Field(
        default_factory=list,
        description="GPUs of the trainer's ranks (rank r on gpus[r]) in the split layout, apart from the engine's "
        "(engine_options.gpus). Empty = rank r on cuda:r.",
    )
    offload: Literal["auto", "none", "optimizer", "all"] = Field(
        "auto",
        description="What the trainer moves to (pinned) CPU memory while the engine serves rollouts, brought back for "
        "the update (the colocated layout, at the sync loop's sleep/wake points). optimizer: AdamW moments and fp32 "
        "master weights; all: the weights too (LoRA: the frozen base with them). auto: optimizer when the engine "
        "sleeps (engine_options.sleep_level > 0), all for full training at sleep_level 2 unless the weights travel "
        "by CUDA IPC; none with sleep_level 0, on the CPU and with nproc > 1. The trainer's cached GPU memory is "
        "freed before the engine wakes whatever this says.",
    )
    gradient_checkpointing: bool = Field(False, description="Recompute each decoder layer in backward (less memory).")
    logprob_chunk: int = Field(512, ge=1, description="Positions per vocabulary-projection chunk.")
    tree: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Prefix-shared training: the batch's branches packed into one token tree per forward pass, each "
        "shared prefix computed once (same logprobs and gradients). auto: when distinct ÷ total tokens < tree_threshold.",
    )
    tree_threshold: float = Field(
        0.75, ge=0, le=1, description="tree=auto packs trees below this distinct ÷ total tokens."
    )
    tree_max_tokens: int = Field(16384, ge=1, description="Distinct tokens per tree forward pass (its micro-batch).")
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO clip below 1 (ε_low).")
    clip_high: float = Field(0.2, ge=0, description="PPO clip above 1 (ε_high); > clip_low is DAPO clip-higher.")
    correction: Literal["tis", "decoupled", "none"] = Field(
        "tis",
        description="none: ratio against the recorded behaviour logprobs. tis: ratio against the trainer's logprobs "
        "at update start, × min(π_prox/π_behav, tis_cap). decoupled: the same, untruncated (decoupled PPO).",
    )
    tis_cap: float = Field(2.0, gt=0, description="Truncation of the importance weight for 'tis'.")
    loss_norm: Literal["trace", "constant"] = Field(
        "trace",
        description="trace: token mean within each trace, mean over traces. constant: Dr. GRPO (Liu et al. 2025): "
        "every token counts the same, loss summed ÷ (max_len × traces). `train.advantage: dr_grpo` sets constant.",
    )
    max_len: int = Field(4096, ge=1, description="The constant normaliser of loss_norm=constant (Dr. GRPO), in tokens.")
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of a k3 KL(π || π_ref) penalty on the sampled tokens, π_ref = the starting weights "
        "(LoRA: the base with adapters off; full: a frozen copy). 0 = off.",
    )
    max_update_kl: float = Field(
        0.0,
        ge=0,
        description="Trust region per step: when the step moves the policy by more than this mean k3 KL on the "
        "batch's own tokens, the step is scaled back (1/2, 1/4, 1/8, else undone). Keeps one copy of the trainable "
        "weights. 0 = off.",
    )
    seed: int = 0

    @model_validator(mode="after")
    def _offload_needs_one_process(self) -> TrainerConfig:
        """The mover swaps whole tensors; FSDP2's shards (DTensors, replayed on every rank) are not wired to it."""
        if self.offload in ("optimizer", "all") and self.nproc > 1:
            raise ValueError(
                f"trainer.offload={self.offload} moves one process's state; with trainer.nproc={self.nproc} each rank "
                "holds 1/N of it already: use trainer.offload=auto (none for a sharded trainer) or trainer.nproc=1"
            )
        return self
