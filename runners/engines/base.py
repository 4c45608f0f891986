"""The engine protocol: generate from token ids, abort, pause/resume, publish weights, report the live version; and
the abilities only some engines have (images, sleep mode, IPC weights, metrics, …), each with its default.

Every engine subclasses it (vLLM server, embedded transformers, the scripted engine used to test harness
integrations, a remote one, a replica set). The proxy talks only to this protocol, always in token ids.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from hrl.runners.trace import add_version

__all__ = [
    "BASIC_SAMPLING",
    "NO_OP_SAMPLING",
    "Engine",
    "ExpandedPrompt",
    "Generation",
    "ImageInput",
    "PublishKind",
    "SamplingParams",
    "TokenDelta",
    "collect",
]

PublishKind = Literal["lora", "full"]
# the sampling knobs that change the distribution tokens are drawn from, and their no-op values
NO_OP_SAMPLING: dict[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
# what an engine honours unless it names its own (`Engine.sampling_knobs`); the others are sent as no-ops
BASIC_SAMPLING = frozenset({"temperature", "top_p", "top_k"})
FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters, in the units the engines understand.

    temperature: 0 means greedy. top_k: 0 means no top-k cut. seed: None means nondeterministic.
    min_p: drop tokens below this share of the most likely one's probability (0 = off). repetition_penalty (1 =
    off), presence_penalty and frequency_penalty (0 = off): vLLM's meanings. The defaults are the no-op values:
    the tokens are then sampled from the model's distribution at `temperature`, untruncated.
    stop_token_ids: generation ends after emitting one of these (the stop token is part of the response).
    ignore_eos: neither the model's EOS nor stop_token_ids end generation; only max_tokens does.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # keep generating past the model's end-of-sequence token (benchmarks, tests)


@dataclass(frozen=True)
class ImageInput:
    """An image sent with a token prompt (`generate(..., images=)`): its bytes as the agent sent them. The prompt
    holds the template's image placeholder once per image, in this order; the engine expands each."""

    data: bytes
    mime: str
    sha256: str


@dataclass(frozen=True)
class ExpandedPrompt:
    """The prompt as an engine that took images ran it: each image placeholder expanded into the model's image
    tokens. `placeholders`: per image, in order, (offset, length) of its expanded run in `prompt_ids`. `processor`:
    the settings of the image processor that made its pixels (`engines.images.processor_settings`), which training
    uses to make the same pixels again; None where the engine does not say. `grids`: per image, the patch grid
    (t, h, w) that places an mRoPE model's image tokens, where the engine made one."""

    prompt_ids: list[int]
    placeholders: list[tuple[int, int]]
    processor: dict[str, Any] | None = None
    grids: list[list[int]] | None = None  # per image, its patch grid (t, h, w) where the model has one (mRoPE)


@dataclass
class TokenDelta:
    """A piece of a streamed generation: new sampled ids with their logprobs, all from one policy version. The first
    delta of a generation with images carries the engine's `prompt` (ExpandedPrompt)."""

    token_ids: list[int]
    logprobs: list[float]
    version: int
    finish_reason: FinishReason | None = None
    prompt: ExpandedPrompt | None = None


@dataclass
class Generation:
    """A finished generation. `versions` is run-length: (start index in token_ids, policy version) pairs."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[tuple[int, int]] = field(default_factory=list)
    finish_reason: FinishReason = "stop"

    def add(self, delta: TokenDelta) -> None:
        add_version(self.versions, len(self.token_ids), delta.version, len(delta.token_ids))
        self.token_ids.extend(delta.token_ids)
        self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason


@runtime_checkable
class Routed(Protocol):
    """What an engine that places generations (`routes = True`: a replica set) learns of the proxy call it serves,
    passed as `generate(..., call=)`: the key that keeps a session on one replica, and where to note the replica
    that served the call, any failover and any move for load. The proxy's `Call` is one."""

    @property
    def sticky_key(self) -> str: ...

    def ran_on(self, replica: str) -> None: ...

    def switched(self, source: str, target: str, after_tokens: int, error: str) -> None: ...

    def moved(self, source: str, target: str, loads: dict[str, int]) -> None: ...


class Engine(Protocol):
    """What the proxy and the trainer need from an inference engine. Every engine subclasses it: the abilities only
    some engines have are members too, and their defaults here are what an engine without them does."""

    name: str
    max_model_len: int = 0  # the context window in tokens; 0 = not known (yet)
    continues_in_place: bool = False  # a publish lands under running requests (else the proxy preempts them)
    takes_images: bool = False  # `generate(..., images=)` (see there)
    images_refused: str | None = None  # why a loaded vision model's images cannot be served here
    expands_images: bool = False  # `expand` makes in this process the prompt it would run with images
    sampling_knobs: frozenset[str] = BASIC_SAMPLING  # the sampling knobs it honours; the others are sent as no-ops
    routes: bool = False  # it places each generation itself (a replica set): `generate` takes the proxy's `call=`
    last_publish_tier: str = ""  # how the last publish's weights travelled (`lora-adapter`, `disk-reload`, …)
    sleep_level: int = 0  # 1 or 2: `sleep` frees the GPU for the trainer's update (vLLM's sleep mode)
    weight_sync: Literal["disk", "ipc"] = "disk"  # ipc: full publishes take the trainer's weights (`attach_weights`)
    dtype: str = "auto"  # the dtype it loads weights in ("auto": the checkpoint's)
    scores: bool = False  # `score` re-scores ids with the model it runs
    logprobs_mode: str | None = None  # what its sampled logprobs are, where they may be other than raw (vLLM's)
    closed: bool = False  # `close` was called

    @property
    def version(self) -> int:
        """The live policy version: the version new tokens are sampled with."""
        ...

    async def start(self) -> None:
        """Load the model / start the server; return when it can serve. Raises EngineStartError."""
        ...

    def generate(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, *, version: int | None = None
    ) -> AsyncIterator[TokenDelta]:
        """Stream sampled tokens for `prompt_ids`. `version` pins a loaded older policy version (None = live).
        An engine with `takes_images = True` also takes `images=[ImageInput, …]` (one placeholder in the prompt per
        image), expands them itself and reports the expanded prompt on its first delta; the proxy sends no images
        to any other."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a running generation; its stream ends with finish_reason 'abort'."""
        ...

    async def pause(self) -> None:
        """Hold generation between steps (requests wait, nothing fails) until resume()."""
        ...

    async def resume(self) -> None: ...

    async def publish(self, path: str, kind: PublishKind, version: int | None = None) -> int:
        """Serve new weights from `path` (a peft adapter dir or a full HF checkpoint) as policy `version`
        (default: the live version + 1; a resumed run passes its own); return the new version. An engine may
        name how the weights travelled in `last_publish_tier` (`lora-adapter`, `disk-reload`, …)."""
        ...

    async def close(self) -> None:
        """Stop everything this engine started. Safe to call twice."""
        ...

    def loaded_versions(self) -> list[int]:
        """Policy versions a request can still be pinned to (`generate(version=)`): the live one alone, by default."""
        return [self.version]

    def expand(self, prompt_ids: list[int], images: list[ImageInput]) -> tuple[ExpandedPrompt, dict[str, Any]]:
        """`expands_images`: the prompt with each image placeholder expanded, and the pixel inputs of one batch row."""
        raise NotImplementedError(f"the {self.name} engine expands no images in this process")

    async def score(self, prompt_ids: list[int], ids: list[int]) -> list[float]:
        """`scores`: the raw logprobs (temperature 1) of `ids` after `prompt_ids` under the live version."""
        raise NotImplementedError(f"the {self.name} engine scores nothing")

    def check_publish(self, kind: PublishKind) -> None:
        """Raise now, not at the first publish after a whole rollout, when a `kind` publish cannot work."""
        return

    async def health(self) -> bool:
        """Whether it serves now (a replica set skips it while it does not): until it is closed, by default."""
        return not self.closed

    async def read_metrics(self) -> dict[str, float]:
        """Its load and prefix-cache counters, in `replicas.parse_vllm_metrics`' names; {} where it keeps none."""
        return {}

    def take_stats(self) -> dict[str, float]:
        """Its metrics of the step since the previous call (a replica set's `routing/*`); {} where it keeps none."""
        return {}

    def attach_weights(self, source: Any) -> bool:
        """`weight_sync: ipc`: full publishes take the trainer's weights from `source`. False: not taken."""
        return False

    async def sleep(self) -> None:
        """`sleep_level` > 0: free the GPU for the trainer's update."""
        return

    async def wake_up(self) -> None:
        """Back to serving after `sleep`, before a publish."""
        return

    async def restore(self, path: str) -> None:
        """After a level-2 sleep with no publish to follow: load `path`, the live version's weights, back in place."""
        return


async def collect(stream: AsyncIterator[TokenDelta]) -> Generation:
    """Drain a generate() stream into one Generation."""
    gen = Generation()
    async for delta in stream:
        gen.add(delta)
    return gen
