"""The training sections of a recipe: `train:` (the outer loop), `trainer:` (the update) and `async:` (the
asynchronous loop), with the check that an async buffer can hold a batch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hrl.config.distill import DistillConfig
from hrl.errors import UsageError

__all__ = [
    "AdvantageKind",
    "AsyncConfig",
    "LoopConfig",
    "LoopSettings",
    "SamplerKind",
    "TrainerConfig",
    "check_batch_fits",
]

AdvantageKind = Literal["grpo", "mean", "dr_grpo", "batch", "distill"]
SamplerKind = Literal["uniform", "signal", "balanced"]

_ALL_PROJ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class TrainerConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    model: str = Field("", description="HF model id or local dir to train (in a run: its `model`).")
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
    ranks_per_node: int = Field(
        0,
        ge=0,
        description="With placement.trainer: ray, the ranks placed on each node (nproc must be a multiple); 0 = one "
        "rank per bundle, spread over the nodes as Ray can.",
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


class LoopSettings(BaseModel):
    """The recipe's `train:` section: the outer loop, without the trainer (its own section)."""

    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    iterations: int = Field(10, ge=1, description="Training steps (one batch of rollouts each).")
    tasks_per_iteration: int = Field(4, ge=1, description="Distinct tasks per batch.")
    group_size: int = Field(4, ge=1, description="Episodes per task per batch (the GRPO group).")
    concurrency: int = Field(4, ge=1, description="Episodes running at once.")
    advantage: AdvantageKind = Field(
        "grpo",
        description="grpo: (r − mean) / std per group. mean: r − mean. dr_grpo: r − mean with the loss ÷ a constant "
        "(Dr. GRPO); sets trainer.loss_norm=constant. batch: (r − mean) / std over the whole batch (REINFORCE++): "
        "a group that all failed is pushed down when another succeeded. distill: the teacher's per-token signal alone "
        "(distill.teacher), no reward term.",
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each batch (PPO epochs); > 1 reuses the rollouts.")
    mini_batches: int = Field(
        1,
        ge=1,
        description="Optimizer steps per epoch, each on a share of the batch's traces. ppo_epochs × mini_batches > 1: "
        "the ratio to the update's starting policy moves, so PPO clipping acts.",
    )
    drop_zero_variance: bool = Field(False, description="Skip groups whose rewards all agree.")
    task_sampler: SamplerKind = Field(
        "uniform",
        description="Which tasks a batch takes. uniform: any task alike. signal: weighted by 1 − p^G − (1 − p)^G, "
        "the chance that a group of G carries a gradient, p = the task's success rate so far (Beta(1, 1) prior). "
        "balanced: the values of sampler_key in turn, each an equal share of the groups.",
    )
    sampler_key: str = Field(
        "",
        description="A task field (dotted path, e.g. repo, or demo.op). signal: its tasks share one success count; "
        "with many tasks each is drawn too rarely for a count of its own ('' = per task). balanced: the families "
        "taken in turn (required).",
    )
    success_reward: float = Field(
        1.0, description="A reward ≥ this is a success, for task_sampler=signal's rates and eval/success."
    )
    eval_every: int = Field(
        0,
        ge=0,
        description="With eval_tasks: also evaluate every N steps, on eval_slice of them (the whole set is "
        "evaluated at step 0 and after the last step either way; in an async run, beside the rollouts, pinned to the "
        "step's version). 0 = only then.",
    )
    eval_slice: int = Field(8, ge=1, description="Held-out tasks of an evaluation between the first and the last.")
    eval_episodes: int = Field(1, ge=1, description="Episodes per held-out task in an evaluation.")
    eval_markers: dict[str, str] = Field(
        default_factory=dict,
        description="With eval_tasks: {name: text}. Each evaluation also logs eval/has/<name>, the share of episodes "
        "whose sampled text contains the text, and eval/success_given/<name>, the success rate among those "
        "(the demo: in_place = 'sed -i', the fix written in place; success among them = the right operator).",
    )
    include_side_calls: bool = Field(False, description="Train on side calls (title generation, …) too.")
    credit: Literal["episode", "turn"] = Field(
        "episode",
        description="episode: every token of a trace gets its advantage. turn: the verifier also scores the sandbox "
        "as each LLM call arrives (rollout.turn_scores; the tests verifier: one grading run per distinct diff), and "
        "each turn's response tokens get credit_coef × (its progress − the mean progress of its agent's turns) added "
        "to the trace's advantage (docs/recipes.md, Turn credit). A trace without every score falls back to episode.",
    )
    credit_coef: float = Field(1.0, gt=0, description="train.credit: turn: the weight of the per-turn term.")
    keep_dropped_media: bool = Field(
        False,
        description="Train on traces whose requests lost media to proxy.media: drop (the model answered without "
        "seeing an image or document the agent sent). Default: left out, counted per step as train/dropped_media.",
    )
    seed: int = 0
    wandb: bool = Field(False, description="Also log metrics to Weights & Biases.")

    @model_validator(mode="after")
    def _balanced_needs_a_key(self) -> LoopSettings:
        if self.task_sampler == "balanced" and not self.sampler_key:
            raise ValueError("train.task_sampler=balanced takes turns over a task field: set train.sampler_key")
        return self


class LoopConfig(LoopSettings):
    """What the loops run with: the `train:` section and the `trainer:` section inside it."""

    trainer: TrainerConfig
    distill: DistillConfig = Field(default_factory=DistillConfig, description="The teacher, when distilling.")

    @model_validator(mode="after")
    def _distill_needs_a_teacher(self) -> LoopConfig:
        """`train.advantage: distill` trains on the teacher's signal alone: without a teacher there is none."""
        if self.advantage == "distill" and not self.distill.enabled:
            raise UsageError(
                "train.advantage=distill trains on a teacher's per-token signal alone, but no distill.teacher is set",
                hint="add -c distill.teacher=MODEL (an HF model dir or id, or an hrl: name with the student's "
                "tokenizer), or use -c train.advantage=grpo",
            )
        return self

    @model_validator(mode="after")
    def _dr_grpo_normalises_by_a_constant(self) -> LoopConfig:
        """Dr. GRPO is both halves: no std scaling (the advantage) and the constant normaliser (the trainer's)."""
        if self.advantage != "dr_grpo" or self.trainer.loss_norm == "constant":
            return self
        if "loss_norm" in self.trainer.model_fields_set:
            raise ValueError(
                "train.advantage=dr_grpo normalises the loss by a constant, but trainer.loss_norm=trace was set: "
                "drop trainer.loss_norm, or use train.advantage=mean for r − mean with the per-trace token mean"
            )
        self.trainer = self.trainer.model_copy(update={"loss_norm": "constant"})
        return self


class AsyncConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    max_in_flight: int = Field(8, ge=1, description="Episodes kept running at all times (M).")
    batch_traces: int = Field(8, ge=1, description="Finished traces per update (N), rounded up to whole groups.")
    max_staleness: int = Field(1, ge=0, description="Tokens more versions old than this are stale (see `staleness`).")
    staleness: Literal["drop", "mask"] = Field(
        "mask",
        description="mask: only a trace's stale tokens leave the loss, the rest of the trace and its group train (a "
        "trace with no fresh token is dropped); drop: a trace with any stale token is left out, so its group trains "
        "short, and long episodes, which span the most publishes, are the ones lost.",
    )
    pace: bool = Field(
        True,
        description="Start no new group while the oldest episode in flight started more than max_staleness versions "
        "before the trainer's version: the trainer runs out of batches and waits for slow episodes instead of "
        "running ahead of them (held seconds: async/paced_s). false: start groups whenever max_in_flight and "
        "max_buffered leave room.",
    )
    max_buffered: int = Field(
        32,
        ge=1,
        description="Most finished-but-untrained traces before new episodes wait; must hold a batch (batch_traces "
        "rounded up to whole groups), else the trainer can wait forever (refused: check_batch_fits).",
    )
    max_failed_groups: int = Field(
        16,
        ge=0,
        description="Stop with an error once more groups than this could not complete (an episode left no trace "
        "at all); each such group is dropped and counted (`async/dropped_groups`).",
    )


def check_batch_fits(acfg: AsyncConfig, group_size: int) -> None:
    """Refuse a buffer that cannot hold a batch. The trainer waits for `batch_traces` rounded up to whole groups; no
    group starts once `max_buffered` finished traces wait. Traces finish into whole groups, so with nothing running
    and less than a batch ready, the producer starts more exactly when ready < max_buffered: always iff
    ceil(max_buffered / G) ≥ ceil(batch_traces / G). Otherwise some timing leaves the trainer waiting forever:
    from the start when ⌊max(M, G) / G⌋ + ceil(max_buffered / G) ≤ ceil(batch_traces / G) (the most ever gathered
    is less than a batch), else once a step leaves between max_buffered and a batch waiting and the episodes in
    flight end (a trainer slower than its rollouts; a group that could not complete), whatever max_in_flight is."""
    groups, buffer = -(-acfg.batch_traces // group_size), -(-acfg.max_buffered // group_size)  # ceil, in groups
    if buffer >= groups:
        return
    need, in_flight = groups * group_size, max(acfg.max_in_flight, group_size) // group_size
    lo, hi = buffer * group_size, need - group_size  # what a take can leave behind that blocks every new group
    left = f"{lo}" if lo == hi else f"{lo} to {hi}"
    takes = f"a batch takes {need} finished traces (whole groups of train.group_size={group_size})"
    if in_flight + buffer <= groups:
        raise UsageError(
            f"async.max_buffered={acfg.max_buffered} and async.max_in_flight={acfg.max_in_flight} can never fill a "
            f"batch of async.batch_traces={acfg.batch_traces}: {takes}, no new group starts once "
            f"{acfg.max_buffered} wait, and at most {(in_flight - 1 + buffer) * group_size} are ever gathered",
            hint=f"use -c async.max_buffered={need} (a whole batch) or more",
        )
    raise UsageError(
        f"async.max_buffered={acfg.max_buffered} cannot hold a batch of async.batch_traces={acfg.batch_traces}: "
        f"{takes}, and no new group starts once {acfg.max_buffered} wait, so a step that leaves {left} waiting leaves the "
        "trainer waiting forever once the episodes in flight end",
        hint=f"use -c async.max_buffered={need} (a whole batch) or more",
    )
