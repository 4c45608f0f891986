"""`hrl models`: build local models that need no model hub."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from hrl.cli.output import emit, err

__all__ = ["app"]

app = typer.Typer(help="Build local models (no model hub needed).", no_args_is_help=True)

TINY_EPILOG = """Examples:

  hrl models tiny ./tiny              # ~0.4M params, tool-calling chat template

  hrl models tiny ./tiny-7 --seed 7   # same seed -> byte-identical files

  hrl models tiny ./tiny --json       # machine-readable summary
"""


@app.command("tiny", epilog=TINY_EPILOG)
def tiny(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into (created if missing).")],
    seed: Annotated[int, typer.Option("--seed", "-s", help="Seed for tokenizer corpus and weights.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Build a tiny chat model offline: BPE tokenizer, ChatML + Hermes tool-call template, random Qwen2."""
    from hrl.train.tiny import build_tiny_model

    t0 = time.monotonic()
    err.print(f"building tiny model in {out_dir} (seed {seed})")
    path = build_tiny_model(out_dir, seed=seed)
    files = sorted(p.name for p in path.iterdir())
    result = {"path": str(path), "seed": seed, "files": files, "seconds": round(time.monotonic() - t0, 2)}
    emit(result, as_json=as_json, human=str(path))
