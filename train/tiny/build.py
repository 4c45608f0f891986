"""What `hrl models tiny` and `hrl models tiny-agent` compute around the builders: the flags checked, a build timed
and summarized, a verification said in words."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["doctor_model", "tiny", "tiny_agent_plan", "tiny_agent_summary", "tiny_once", "tiny_vision", "verify_text"]

Say = Callable[[str], object]


def tiny(
    out_dir: Path, seed: int, family: str, sliding_window: int | None, vision: bool, layout: str, say: Say
) -> dict[str, Any]:
    """`hrl models tiny`: the tiny chat model (with `vision`, `tiny_vision`'s), built and summarized (path, files,
    seconds); an unknown family, or a layout without `vision`, is refused before anything is written. The start is
    said to `say`."""
    from hrl.runners.errors import UsageError
    from hrl.train.tiny.families import family_spec
    from hrl.train.tiny.model import TinyModelConfig, build_tiny_model

    family_spec(family)  # an unknown family fails before anything is written
    if vision:
        return tiny_vision(out_dir, seed, family, sliding_window, layout, say)
    if layout != "idefics3":
        raise UsageError("--vision-layout chooses the layout of a --vision model", hint="add --vision")
    t0 = time.monotonic()
    window = f", sliding window {sliding_window}" if sliding_window else ""
    say(f"building tiny model in {out_dir} (seed {seed}, family {family}{window})")
    path = build_tiny_model(out_dir, seed=seed, family=family, cfg=TinyModelConfig(sliding_window=sliding_window))
    files = sorted(p.name for p in path.iterdir())
    return {"path": str(path), "seed": seed, "family": family, "sliding_window": sliding_window, "files": files,
            "seconds": round(time.monotonic() - t0, 2)}  # fmt: skip


def doctor_model(folder: Path, images: bool) -> Path:
    """The model `hrl agents doctor` checks with when none is given, built in `folder`: the tiny model, or with
    `images` the tiny vision-language one."""
    from hrl.train.tiny.model import build_tiny_model
    from hrl.train.tiny.vision import build_tiny_vision_model

    return build_tiny_vision_model(folder / "tiny-vl") if images else build_tiny_model(folder / "tiny")


def tiny_once(out: Path, name: str, say: Say) -> Path:
    """`--model hrl:tiny`: the tiny model in `out`, built there the first time (deterministically, into a `.partial`
    folder renamed at the end, so `out` is whole or absent); the build is said to `say`, naming the model `name`."""
    from hrl.train.tiny.model import build_tiny_model

    if (out / "config.json").is_file():
        return out
    say(f"building {name} into {out} (once) …")
    tmp = out.with_name(out.name + ".partial")
    build_tiny_model(tmp)
    tmp.rename(out)
    return out


def tiny_vision(
    out_dir: Path, seed: int, family: str, sliding_window: int | None, layout: str, say: Say
) -> dict[str, Any]:
    """`hrl models tiny --vision`: the tiny vision-language model, built and summarized (path, files, seconds); other
    families and windows are refused before anything is written (its template is the Hermes one with image parts,
    its decoder attends fully). The start is said to `say`."""
    from hrl.runners.errors import UsageError
    from hrl.train.tiny.vision import VISION_LAYOUTS, TinyVisionConfig, build_tiny_vision_model

    if family != "hermes" or sliding_window is not None:
        raise UsageError("--vision builds the Hermes family with full attention only",
                         hint="drop --family/--sliding-window, or --vision")  # fmt: skip
    if layout not in VISION_LAYOUTS:
        raise UsageError(f"unknown --vision-layout {layout!r}", hint=f"one of: {', '.join(VISION_LAYOUTS)}")
    t0 = time.monotonic()
    say(f"building tiny vision-language model in {out_dir} (seed {seed}, layout {layout})")
    path = build_tiny_vision_model(out_dir, seed=seed, cfg=TinyVisionConfig(layout=layout))
    files = sorted(p.name for p in path.iterdir())
    return {"path": str(path), "seed": seed, "family": family, "vision": True, "vision_layout": layout,
            "files": files, "seconds": round(time.monotonic() - t0, 2)}  # fmt: skip


def tiny_agent_plan(
    out_dir: Path, seed: int, right_op: float, in_place: float, verify: bool, force: bool
) -> tuple[Any, Path | None]:
    """`hrl models tiny-agent`'s config (a share below 0: the recipe's) and, with `verify`, the shipped build to
    compare with (the default config's only: any other is refused). With `force` or `verify` the build record in
    `out_dir` is removed, so the model is trained again."""
    from hrl.runners.errors import UsageError
    from hrl.train.tiny.agent import BUILD_INFO, TinyAgentConfig, build_info, shipped_model

    noise = {k: v for k, v in {"right_op": right_op, "in_place": in_place}.items() if v >= 0}
    cfg = TinyAgentConfig(seed=seed, **noise)
    reference = shipped_model() if verify else None
    if verify and (reference is None or (build_info(reference) or {}).get("key") != cfg.key()):
        raise UsageError("--verify compares with the shipped build, which is the default config's only",
                         hint="drop --seed/--right-op/--in-place, or --verify")  # fmt: skip
    if force or verify:
        (out_dir / BUILD_INFO).unlink(missing_ok=True)
    return cfg, reference


def tiny_agent_summary(path: Path, seed: int) -> dict[str, Any]:
    """The tiny agent model built in `path`, as `hrl models tiny-agent` reports it."""
    from hrl.train.tiny.agent import build_info

    info = build_info(path) or {}
    return {"path": str(path), "seed": seed, "params": info.get("params"), "final_loss": info.get("final_loss"),
            "build_seconds": info.get("seconds"), "agent": info.get("agent")}  # fmt: skip


def verify_text(path: Path, reference: Path, check: dict[str, Any]) -> str:
    """`verify_build`'s result in words, a line a check (`hrl models tiny-agent --verify`)."""
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
