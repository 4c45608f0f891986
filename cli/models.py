"""`hrl models`: build local models that need no model hub; `get` and `ls` (pretrained ones) live in cli/pretrained.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, err, say
from hrl.cli.pretrained import GET_EPILOG, LS_EPILOG, get, ls

__all__ = ["app"]

app = typer.Typer(help="Build local models, or fetch pretrained ones (no model hub needed).", no_args_is_help=True)
app.command("get", epilog=GET_EPILOG)(get)
app.command("ls", epilog=LS_EPILOG)(ls)
app.command("list", hidden=True)(ls)

TINY_EPILOG = """Examples:

  hrl models tiny ./tiny              # ~0.4M params, tool-calling chat template

  hrl models tiny ./tiny-7 --seed 7   # same seed -> byte-identical files

  hrl models tiny ./tiny --json       # machine-readable summary

  hrl models tiny ./tiny-oss --family gpt-oss   # Harmony template and special tokens

  hrl models tiny ./tiny-sw --sliding-window 32  # every layer attends to its last 32 positions

  hrl models tiny ./tiny-vl --vision            # images in: Idefics3's layout, 4 tokens an image

  hrl models tiny ./tiny-qvl --vision --vision-layout qwen2-vl   # Qwen2-VL's: mRoPE positions, 2-8 tokens an image
"""


_Family = Annotated[
    str,
    typer.Option(
        help="Model family whose chat template and special tokens it gets: hermes, qwen3-coder, glm45, llama3, "
        "mistral, deepseek-v3, kimi-k2, gpt-oss."
    ),
]
_SlidingWindow = Annotated[
    int | None,
    typer.Option(
        "--sliding-window",
        min=1,
        help="Sliding-window attention on every layer: each position attends to itself and the W - 1 before it "
        "(as Mistral v0.1). Default: full attention.",
    ),
]
_Vision = Annotated[
    bool,
    typer.Option(
        "--vision",
        help="A vision-language model (Idefics3's layout, which transformers and vLLM load without "
        "torchvision): the same tokenizer plus <image> and its wrapping tokens, the chat template with image "
        "parts, an image processor (4 tokens an image), a vision tower and connector before the decoder. "
        "Hermes family, full attention only.",
    ),
]
_VisionLayout = Annotated[
    str,
    typer.Option(
        "--vision-layout",
        help="With --vision: idefics3 (one position a token, 4 tokens an image; vLLM serves it here too) or "
        "qwen2-vl (Qwen2-VL's processor, tower and multi-dimensional rotary positions, mRoPE: 2 to 8 tokens an "
        "image by its aspect).",
    ),
]


@app.command("tiny", epilog=TINY_EPILOG)
def tiny(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into (created if missing).")],
    seed: Annotated[int, typer.Option("--seed", "-s", help="Seed for tokenizer corpus and weights.")] = 0,
    family: _Family = "hermes",
    sliding_window: _SlidingWindow = None,
    vision: _Vision = False,
    vision_layout: _VisionLayout = "idefics3",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Build a tiny chat model offline: BPE tokenizer, a family's chat template and special tokens (default: ChatML
    + Hermes tool calls), random Qwen2. config.json records the family; the proxy picks its tool-call parser."""
    from hrl.train.tiny.build import tiny as build

    result = build(out_dir, seed, family, sliding_window, vision, vision_layout, say=err.print)
    emit(result, as_json=as_json, human=result["path"])


TINY_AGENT_EPILOG = """Examples:

  hrl models tiny-agent ~/.cache/hrl/models/tiny-agent    # what `make demo` uses: the recipe's shipped build, copied

  hrl models tiny-agent ./rebuilt --verify                # build it from scratch (minutes) and compare

  hrl models tiny-agent ./agent-7 --seed 7                # another seed: other SFT data, weights and noise

  hrl models tiny-agent ./agent --right-op 0.8 --json     # a stronger warm start; machine-readable summary
"""


@app.command("tiny-agent", epilog=TINY_AGENT_EPILOG)
def tiny_agent(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into (created if missing).")],
    seed: Annotated[int, typer.Option("--seed", "-s", help="Seed for SFT data, noise, tokenizer and weights.")] = 0,
    right_op: Annotated[
        float,
        typer.Option(
            max=1.0,
            help="Share of SFT fixes that use the right operator (the warm start's skill); below 0 = the recipe's.",
        ),
    ] = -1.0,
    in_place: Annotated[
        float,
        typer.Option(
            max=1.0,
            help="Share of SFT fixes whose sed writes the file (-i), the rest only print the fix; below 0 = the recipe's.",
        ),
    ] = -1.0,
    force: Annotated[
        bool, typer.Option("--force", help="Train from scratch even if DIR, or the recipe, holds this exact build.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Train from scratch into DIR and compare with the shipped build (exit 1 on a difference): byte "
            "for byte on a machine with the builder's torch build and CPU features; elsewhere the same "
            "tokenizer and config bytes, weights within a tolerance and the same greedy answers.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Build the CPU demo's agent model: a few-million-parameter Qwen2 warm-started on synthetic mini-swe-agent
    episodes (cat the module, sed a fix, submit) so that it fixes demo bugs sometimes, and often not. The default
    config's build ships with the demo recipe and is copied; other seeds and shares are trained (minutes)."""
    from hrl.train.tiny import verify_build, verify_text
    from hrl.train.tiny.build import tiny_agent_plan, tiny_agent_summary

    cfg, reference = tiny_agent_plan(out_dir, seed, right_op, in_place, verify, force)
    path = build_tiny_agent_showing_progress(out_dir, cfg, quiet=as_json, use_shipped=not (force or verify))
    result = tiny_agent_summary(path, seed)
    if reference is None:
        emit(result, as_json=as_json, human=str(path))
        return
    if not as_json:
        say("comparing with the shipped build")
    check = verify_build(path, reference)
    result |= {"reference": str(reference)} | check
    emit(result, as_json=as_json, human=verify_text(path, reference, check))
    if not check["verified"]:
        raise typer.Exit(1)


def build_tiny_agent_showing_progress(
    out_dir: Path, cfg: Any = None, quiet: bool = False, use_shipped: bool = True
) -> Path:
    """Build (or find built, or copy the shipped build of) the tiny agent model, with a progress bar on a terminal
    and a line per 20 steps elsewhere (CI logs); `quiet` keeps only the start line."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from hrl.cli.output import want_color
    from hrl.train.tiny import TinyAgentConfig, build_tiny_agent

    cfg = cfg or TinyAgentConfig()
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} loss {task.fields[loss]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err, disable=not want_color() or quiet,
    )  # fmt: skip
    bar = progress.add_task("SFT", total=None, loss="-")

    def on_event(kind: str, data: dict[str, Any]) -> None:
        if kind == "data":
            err.print(f"building the tiny agent model in {out_dir} (seed {cfg.seed}; minutes on 2 cores)", markup=False)
        if quiet:
            return
        if kind == "step":
            progress.update(bar, total=data["steps"], completed=data["step"], loss=f"{data['loss']:.3f}")
            if progress.disable and (data["step"] % 20 == 0 or data["step"] == data["steps"]):
                err.print(f"step {data['step']}/{data['steps']} loss {data['loss']:.3f}", markup=False)
        elif kind == "tokenized":
            err.print(f"{data['examples']} {data['context']} transcripts, {data['mean_tokens']:.0f} tokens each",
                      markup=False)  # fmt: skip
        elif kind == "cached":
            err.print(f"tiny agent model: {out_dir} (already built with this config and harness profile)", markup=False)
        elif kind == "shipped":
            err.print(f"tiny agent model: {out_dir}, the build shipped in {data['from']} (sha256 checked; "
                      "`hrl models tiny-agent DIR --verify` trains it again and compares, byte for byte)",
                      markup=False)  # fmt: skip

    with progress:
        return build_tiny_agent(out_dir, cfg, on_event, use_shipped=use_shipped)
