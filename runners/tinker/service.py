"""The state behind `hrl serve --tinker`: sessions, LoRA training models and their requests, in the order the SDK
sends them. Training runs in a `LoraTrainer` (torch, `hrl.train.tinker_ops`), handed in by whoever stands the service
up, one thread per request; sampling lives in `sampling.Samplers`.

Requests of one model run one at a time, in arrival order: the SDK sends a training client's requests in its own
order (seq_id) and waits for each send before the next, so arrival order is that order."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tinker import types

from hrl.runners.errors import ClientError
from hrl.runners.tinker.checkpoints import checkpoint_dir, read_meta, tinker_path, write_meta

__all__ = ["LOSSES", "LoraTrainer", "Model", "Session", "TinkerService", "TrainerFactory"]

LOSSES = ("cross_entropy", "importance_sampling", "ppo")  # the loss_fn values hrl computes; the rest answer 400


class LoraTrainer(Protocol):
    """One LoRA on the served model, updated by the Tinker calls. Called from one thread at a time."""

    def forward_backward(
        self, data: list[types.Datum], loss_fn: str, config: Mapping[str, float | str], forward_only: bool
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Per datum its outputs (`logprobs` of its target tokens), and the metrics (`loss:sum`, …); gradients are
        added to those of earlier calls unless `forward_only`."""
        ...

    def optim_step(self, params: types.AdamParams) -> dict[str, float]:
        """One AdamW step with these hyperparameters on the gradients summed so far, which it then clears."""
        ...

    def save(self, out: Path, optimizer: bool) -> None:
        """The adapter (a peft folder an engine publishes), and the optimizer state with `optimizer`."""
        ...

    def load(self, folder: Path, optimizer: bool) -> None: ...


TrainerFactory = Callable[[str, types.LoraConfig], LoraTrainer]  # (the model's folder, the LoRA asked for)


@dataclass
class Session:
    session_id: str
    owner: str  # the client key's name
    seen: float = field(default_factory=time.monotonic)  # its last request or heartbeat (the SDK beats every 10 s)
    finished: bool = False


@dataclass
class Model:
    model_id: str
    session: Session
    lora: types.LoraConfig
    trainer: LoraTrainer | None = None  # None until create_model's request has built it
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    saves: int = 0


class TinkerService:
    """Sessions and training models of the served base model `name` (its folder `path`), checkpoints under
    `checkpoints`."""

    def __init__(
        self, name: str, path: str, checkpoints: Path, make_trainer: TrainerFactory, idle_s: float = 600.0
    ) -> None:
        self.name, self.path, self.checkpoints = name, path, checkpoints
        self.make_trainer, self.idle_s = make_trainer, idle_s
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, Model] = {}

    # ---- sessions -------------------------------------------------------------------------------------------------
    def create_session(self, owner: str) -> Session:
        """A new session; sessions silent for `idle_s` (their client gone without closing) are ended first."""
        now = time.monotonic()
        for gone in [s for s in self.sessions.values() if not s.finished and now - s.seen > self.idle_s]:
            self.finish(gone.owner, gone.session_id)
        session = Session("s" + secrets.token_hex(8), owner)
        self.sessions[session.session_id] = session
        return session

    def session(self, owner: str, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None or session.owner != owner:
            raise ClientError(404, f"no session {session_id} (unknown, or another key's)")
        if session.finished:
            raise ClientError(410, f"session {session_id} has finished")
        session.seen = time.monotonic()
        return session

    def finish(self, owner: str, session_id: str) -> None:
        """The session ends: its training models are dropped, their memory freed (their saved checkpoints stay)."""
        session = self.session(owner, session_id)
        session.finished = True
        for model_id in [m for m, model in self.models.items() if model.session is session]:
            del self.models[model_id]

    def check_base(self, base_model: str | None) -> None:
        if base_model not in (None, self.name, self.path):
            raise ClientError(404, f"base model {base_model!r} is not served here: this server serves {self.name!r} "
                                   f"(hrl serve --tinker --model {base_model} serves that one)")  # fmt: skip

    # ---- models ---------------------------------------------------------------------------------------------------
    def model(self, owner: str, model_id: str) -> Model:
        model = self.models.get(model_id)
        if model is None or model.session.owner != owner:
            raise ClientError(404, f"no training model {model_id} (unknown, of another key, or its session ended)")
        return model

    def new_model(self, owner: str, session_id: str, seq: int, lora: types.LoraConfig) -> Model:
        """Register model `<session>:train:<seq>` (the id the SDK derives itself for a model made by loading)."""
        session = self.session(owner, session_id)
        model_id = f"{session_id}:train:{seq}"
        if model_id in self.models:
            raise ClientError(409, f"training model {model_id} exists already")
        model = self.models[model_id] = Model(model_id, session, lora)
        return model

    async def build(self, model: Model, state: Path | None = None, optimizer: bool = False) -> None:
        """Build the model's trainer (the slow part of create_model), from the training state `state` if given."""
        async with model.lock:
            model.trainer = await asyncio.to_thread(self.make_trainer, self.path, model.lora)
            if state is not None:
                await asyncio.to_thread(model.trainer.load, state, optimizer)

    async def run(self, model: Model, op: Callable[[LoraTrainer], Any]) -> Any:
        """`op(trainer)` in a thread, after the model's earlier requests."""
        async with model.lock:
            if model.trainer is None:
                raise ClientError(400, f"training model {model.model_id} failed to build")
            return await asyncio.to_thread(op, model.trainer)

    def info(self, model: Model) -> types.GetInfoResponse:
        data = types.ModelData(arch="lora", model_name=self.name, tokenizer_id=self.path)
        return types.GetInfoResponse(model_data=data, model_id=model.model_id, is_lora=True,
                                     lora_rank=model.lora.rank, model_name=self.name)  # fmt: skip

    # ---- checkpoints ----------------------------------------------------------------------------------------------
    async def save(self, model: Model, kind: str, name: str | None, optimizer: bool) -> tuple[str, Path]:
        """Save the model's adapter (and optimizer state) as checkpoint `name` of `kind`; its tinker path and folder.
        No name: an ephemeral one, numbered."""
        model.saves += 1
        name = name or f"ephemeral-{model.saves:04d}"
        path = tinker_path(model.model_id, kind, name)  # type: ignore[arg-type]
        folder = self.checkpoints / model.model_id / kind / name

        def save(trainer: LoraTrainer) -> None:
            folder.mkdir(parents=True, exist_ok=True)
            trainer.save(folder, optimizer)
            write_meta(folder, {"base_model": self.name, "lora_config": model.lora.model_dump()})

        await self.run(model, save)
        return path, folder

    def state(self, path: str) -> tuple[Path, types.LoraConfig]:
        """A training state's folder and the LoRA it was saved with."""
        folder = checkpoint_dir(self.checkpoints, path, ("weights",))
        return folder, types.LoraConfig.model_validate(read_meta(folder)["lora_config"])
