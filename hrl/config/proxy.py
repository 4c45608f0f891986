"""The recipe's `proxy:` section: the recording proxy in front of the engine."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BYTES_PER_TOKEN", "MediaPolicy", "ProxyConfig"]

MediaPolicy = Literal["refuse", "drop"]


# The most UTF-8 bytes of prompt text one token stands for, on average over a prompt, in the tokenizers hrl serves
# (English and code run 3 to 5, CJK text 1 to 3; a long run of spaces or of one symbol a few tokens of up to
# 16 or so): a prompt with more text than this × the context window cannot fit it, and is refused untokenized.
BYTES_PER_TOKEN = 32


class ProxyConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)  # no bound holds inf or nan

    model_name: str = Field("model", description="Model name reported to agents.")
    open_sessions: bool = Field(
        False,
        description="Open a session for any token a request names (quick manual use only: anyone who can reach "
        "the port can then write traces). Default: only registered sessions are served, others get a 401.",
    )
    idle_timeout_s: float = Field(1800, ge=0, description="End a session after this long without a request; 0 = never.")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1, description="Larger request bodies get a 413.")
    default_max_tokens: int = Field(1024, ge=1, description="max_tokens when the agent sends none.")
    max_context: int = Field(0, ge=0, description="Context window in tokens; 0 = the engine's / model's.")
    max_prompt_bytes: int = Field(
        4 << 20,
        ge=0,
        le=1 << 40,
        description="A prompt whose text (messages, tool calls, tool schemas) is over this many UTF-8 bytes, or over "
        f"the context window × {BYTES_PER_TOKEN} bytes per token (32768 tokens: 1 MiB), which no prompt that fits "
        "the window reaches, is refused before it is tokenized: a 400 in the dialect's shape, recorded as a failed "
        "call without prompt ids. Default 4 MiB: text runs about 4 bytes a token, so 4 MiB is about a million "
        "tokens, as long as the longest windows served, and it bounds the seconds one request holds a tokenizer "
        "thread whatever the window (256k tokens alone allow 8 MiB). 0 = no absolute cap, the window's only.",
    )
    max_queued_prompts: int = Field(
        32,
        ge=1,
        le=100_000,
        description="The most requests of one session's tree that may hold or wait for its prompt lock at once (the "
        "lock under which a large body is read, a prompt tokenized or counted): one more is a 429 in the dialect's "
        "shape, counted as proxy/queued_refused, so one client's flood of bodies is let go at once, not held in "
        "memory while the others' are tokenized one at a time.",
    )
    max_children: int = Field(
        64,
        ge=0,
        le=4096,
        description="The most sub-agents (child sessions, registered or recognised) one session's tree may open; "
        "a request for one more is a 429 in the dialect's shape, counted as proxy/children_refused and in the "
        "trace's metadata.children_refused.",
    )
    media: MediaPolicy = Field(
        "refuse",
        description="A request holding media the served model cannot take (an image for a model without vision, "
        "a document, audio, video). refuse: a 400 in the dialect's shape naming the part (messages[2].content[1]: "
        "an image part; …). drop: the parts are left out and counted, per call and per trace (dropped_media: "
        "{image: n, document: m}); hrl train leaves such traces out unless train.keep_dropped_media. A vision "
        "model's images are served, not dropped.",
    )
    max_image_bytes: int = Field(
        20 * 1024 * 1024, ge=1, description="A larger image (decoded bytes) gets a 413 in the dialect's shape."
    )
    max_images: int = Field(64, ge=0, description="A request with more images than this gets a 400.")
    tokenizer_threads: int = Field(
        0,
        ge=0,
        le=64,
        description="Threads that render and tokenize prompts, off the serving loop (each session one prompt at a "
        "time); 0 = min(4, CPU count).",
    )
    redact: bool = Field(
        True,
        description="Replace host secrets (values of secret-named variables, known key formats) in the request "
        "text before it is tokenized, so no prompt id, trace or model input carries them (hrl.runners.redact).",
    )
    stream_coalesce_ms: float = Field(
        2.0,
        ge=0,
        description="Streaming: text that arrives within this many ms of the last write is held and sent as one "
        "event (one write); nothing waits longer. 0 = one event per engine delta. The trace is the same either way.",
    )
    stream_coalesce_tokens: int = Field(
        16, ge=0, description="Streaming: write at once when this many sampled tokens are held; 0 = no token bound."
    )
    workers: int = Field(1, ge=1, description="Proxy worker processes on this node (runners.serving.workers); 1 = one.")
    worker_index: int = Field(
        0, ge=0, description="This worker's index: it serves, and registers, only the session tokens it owns."
    )
    tool_parser: str = Field(
        "auto",
        description="How the model writes tool calls: hermes, qwen3-coder, glm45, llama3, mistral, deepseek-v3, "
        "kimi-k2, gpt-oss (runners.proxy.toolparsers); auto = from the model's chat template and config.json.",
    )
    tool_prompt: Literal["auto", "hermes", "refuse"] = Field(
        "auto",
        description="A request with tools for a model whose chat template cannot show tools (it renders none of "
        "them: a plain ChatML template). hermes: the proxy shows them itself in the Hermes tool prompt (`# Tools`, "
        "one JSON schema a line in <tools></tools>, calls as <tool_call> JSON) at the end of the system message, "
        "with earlier tool calls as <tool_call> blocks and tool results as <tool_response> blocks of a user message, "
        "and reads replies with the hermes parser (under tool_parser auto); each such call records tool_prompt: "
        "hermes in the trace. refuse: a 400 naming the setting. auto: hermes. A template that shows tools is used as "
        "it is, whatever this says.",
    )
    reasoning_parser: str = Field(
        "auto",
        description="How the model writes its reasoning: think (a leading <think>…</think>), think-open (the "
        "template opens <think> in the generation prompt), mistral ([THINK]…[/THINK]), harmony (gpt-oss's analysis "
        "channel) (runners.proxy.reasoning); auto = from the chat template and the tool parser.",
    )
    sampling: Literal["agent", "honest"] = Field(
        "agent",
        description="agent: sample with the temperature, top_p, top_k, min_p and penalties the agent sends (those "
        "the engine implements). honest: every call samples at temperature 1 with top_p, top_k, min_p and the "
        "repetition/presence/frequency penalties at their no-op values, whatever the agent sends, so the recorded "
        "logprobs (the engines' raw model logprobs) are those of the distribution the tokens were drawn from. "
        "hrl train always uses honest and refuses agent.",
    )
    version_policy: Literal["mixed", "pin"] = Field(
        "mixed",
        description="On a publish, in-flight traces continue on the new weights (mixed; each token records its "
        "version) or keep the version they started with until they end (pin; needs LoRA publishes).",
    )
