"""`hrl models`: build local models that need no model hub; `get` and `ls` (pretrained ones) live in cli/pretrained.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, err
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


@app.command("tiny", epilog=TINY_EPILOG)
def tiny(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into (created if missing).")],
    seed: Annotated[int, typer.Option("--seed", "-s", help="Seed for tokenizer corpus and weights.")] = 0,
    family: Annotated[
        str,
        typer.Option(
            help="Model family whose chat template and special tokens it gets: hermes, qwen3-coder, glm45, llama3, "
            "mistral, deepseek-v3, kimi-k2, gpt-oss."
        ),
    ] = "hermes",
    sliding_window: Annotated[
        int | None,
        typer.Option(
            "--sliding-window",
            min=1,
            help="Sliding-window attention on every layer: each position attends to itself and the W - 1 before it "
            "(as Mistral v0.1). Default: full attention.",
        ),
    ] = None,
    vision: Annotated[
        bool,
        typer.Option(
            "--vision",
            help="A vision-language model (Idefics3's layout, which transformers and vLLM load without "
            "torchvision): the same tokenizer plus <image> and its wrapping tokens, the chat template with image "
            "parts, an image processor (4 tokens an image), a vision tower and connector before the decoder. "
            "Hermes family, full attention only.",
        ),
    ] = False,
    vision_layout: Annotated[
        str,
        typer.Option(
            "--vision-layout",
            help="With --vision: idefics3 (one position a token, 4 tokens an image; vLLM serves it here too) or "
            "qwen2-vl (Qwen2-VL's processor, tower and multi-dimensional rotary positions, mRoPE: 2 to 8 tokens an "
            "image by its aspect).",
        ),
    ] = "idefics3",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Build a tiny chat model offline: BPE tokenizer, a family's chat template and special tokens (default: ChatML
    + Hermes tool calls), random Qwen2. config.json records the family; the proxy picks its tool-call parser."""
    from hrl.train.tiny import TinyModelConfig, build_tiny_model
    from hrl.train.tiny.families import family_spec

    family_spec(family)  # an unknown family fails before anything is written
    if vision:
        _tiny_vision(out_dir, seed, family, sliding_window, vision_layout, as_json)
        return
    if vision_layout != "idefics3":
        from hrl.runners.errors import UsageError

        raise UsageError("--vision-layout chooses the layout of a --vision model", hint="add --vision")
    t0 = time.monotonic()
    window = f", sliding window {sliding_window}" if sliding_window else ""
    err.print(f"building tiny model in {out_dir} (seed {seed}, family {family}{window})")
    path = build_tiny_model(out_dir, seed=seed, family=family, cfg=TinyModelConfig(sliding_window=sliding_window))
    files = sorted(p.name for p in path.iterdir())
    result = {"path": str(path), "seed": seed, "family": family, "sliding_window": sliding_window, "files": files,
              "seconds": round(time.monotonic() - t0, 2)}  # fmt: skip
    emit(result, as_json=as_json, human=str(path))


def _tiny_vision(out_dir: Path, seed: int, family: str, sliding_window: int | None, layout: str, as_json: bool) -> None:
    """`hrl models tiny --vision`: the tiny vision-language model; other families and windows are refused before
    anything is written (its template is the Hermes one with image parts, its decoder attends fully)."""
    from hrl.runners.errors import UsageError
    from hrl.train.tiny import TinyVisionConfig, build_tiny_vision_model
    from hrl.train.tiny.vision import VISION_LAYOUTS

    if family != "hermes" or sliding_window is not None:
        raise UsageError("--vision builds the Hermes family with full attention only",
                         hint="drop --family/--sliding-window, or --vision")  # fmt: skip
    if layout not in VISION_LAYOUTS:
        raise UsageError(f"unknown --vision-layout {layout!r}", hint=f"one of: {', '.join(VISION_LAYOUTS)}")
    t0 = time.monotonic()
    err.print(f"building tiny vision-language model in {out_dir} (seed {seed}, layout {layout})")
    path = build_tiny_vision_model(out_dir, seed=seed, cfg=TinyVisionConfig(layout=layout))
    files = sorted(p.name for p in path.iterdir())
    result = {"path": str(path), "seed": seed, "family": family, "vision": True, "vision_layout": layout,
              "files": files, "seconds": round(time.monotonic() - t0, 2)}  # fmt: skip
    emit(result, as_json=as_json, human=str(path))


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
    from hrl.runners.errors import UsageError
    from hrl.train.tiny import BUILD_INFO, TinyAgentConfig, build_info, shipped_model, verify_build

    noise = {k: v for k, v in {"right_op": right_op, "in_place": in_place}.items() if v >= 0}
    cfg = TinyAgentConfig(seed=seed, **noise)
    reference = shipped_model() if verify else None
    if verify and (reference is None or (build_info(reference) or {}).get("key") != cfg.key()):
        raise UsageError("--verify compares with the shipped build, which is the default config's only",
                         hint="drop --seed/--right-op/--in-place, or --verify")  # fmt: skip
    if force or verify:
        (out_dir / BUILD_INFO).unlink(missing_ok=True)
    path = build_tiny_agent_showing_progress(out_dir, cfg, quiet=as_json, use_shipped=not (force or verify))

    info = build_info(path) or {}
    result = {"path": str(path), "seed": seed, "params": info.get("params"), "final_loss": info.get("final_loss"),
              "build_seconds": info.get("seconds"), "agent": info.get("agent")}  # fmt: skip
    if reference is None:
        emit(result, as_json=as_json, human=str(path))
        return
    if not as_json:
        err.print("comparing with the shipped build", markup=False)
    check = verify_build(path, reference)
    result |= {"reference": str(reference)} | check
    emit(result, as_json=as_json, human=_verify_text(path, reference, check))
    if not check["verified"]:
        raise typer.Exit(1)


def _verify_text(path: Path, reference: Path, check: dict[str, Any]) -> str:
    """The human rendering of `verify_build`'s result."""
    lines = [
        f"{'same' if r['same'] else 'DIFFERS'}  {r['file']}  {(r['built'] or 'missing')[:16]}" for r in check["files"]
    ]
    if not check["reference_intact"]:
        lines.append(f"the shipped build {reference} does not match its own sha256 record (restore it from git)")
    if check["mode"] == "bytes":
        verdict = "byte-identical to" if check["verified"] else "NOT identical to"
        lines.append(f"{path}: {verdict} the shipped build {reference} (same torch build and CPU features)")
        return "\n".join(lines)
    c = check["checks"]
    lines += [
        f"this machine's float kernels differ from the builder's ({check['reference_machine']}): compared as a model",
        f"{'same' if c['other_files_same'] else 'DIFFERS'}  every file but the weights, byte for byte",
        f"{'same' if c['tensors_same'] else 'DIFFERS'}  tensor names, shapes and dtypes (weights drift "
        f"{check['tensors']['drift']:.0%} of their norm: training carries the first rounding difference on)",
        f"{'same' if c['fixed_turns_same'] else 'DIFFERS'}  greedy answers on the read and submit turns "
        f"({len(check['fixed_turns_differ'])} of {check['greedy_prompts'] * 2 // 3} differ)",
        f"{'ok' if c['fixes_well_formed'] else 'BAD'}  a sed fix on every fix turn "
        f"({check['fix_turns_differ']} of {check['greedy_prompts'] // 3} name other operators than the shipped build's)",
        f"{'ok' if c['loss_within'] else 'BAD'}  held-out loss {check['heldout_loss'][0]} vs {check['heldout_loss'][1]} "
        f"(ratio {check['loss_ratio']}, at most {check['loss_ratio_max']})",
        f"{path}: {'the same model as' if check['verified'] else 'NOT the same model as'} the shipped build {reference}",
    ]
    return "\n".join(lines)


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
