"""Where a Tinker checkpoint lives: `tinker://<model_id>/weights/<name>` (training state: adapter, optimizer, the
LoRA it was made with) and `tinker://<model_id>/sampler_weights/<name>` (an adapter to sample with) are folders of
the run directory, `<run>/checkpoints/<model_id>/<kind>/<name>/`. The path names the folder, so a server started
again in the same run directory loads what an earlier one saved."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from hrl.runners.errors import ClientError

__all__ = ["META_FILE", "Kind", "checkpoint_dir", "read_meta", "tinker_path", "write_meta"]

Kind = Literal["weights", "sampler_weights"]
META_FILE = "tinker.json"  # {base_model, lora_config}: what a training client created from this state needs
_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,127}$")  # one path segment: no '/', no '..'


def tinker_path(model_id: str, kind: Kind, name: str) -> str:
    _check(model_id, "model id")
    _check(name, "checkpoint name")
    return f"tinker://{model_id}/{kind}/{name}"


def checkpoint_dir(root: Path, path: str, kinds: tuple[Kind, ...] = ("weights", "sampler_weights")) -> Path:
    """The folder of the checkpoint `path` names (one of `kinds`); ClientError 400 for a path of another shape, 404
    for one nothing was saved at."""
    parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
    if len(parts) != 3 or parts[1] not in kinds:
        raise ClientError(400, f"{path!r} is not a checkpoint path here: tinker://MODEL_ID/({'|'.join(kinds)})/NAME")
    model_id, kind, name = parts
    _check(model_id, "model id")
    _check(name, "checkpoint name")
    folder = root / model_id / kind / name
    if not folder.is_dir():
        raise ClientError(404, f"no checkpoint {path} (nothing saved at {folder})")
    return folder


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    (folder / META_FILE).write_text(json.dumps(meta, indent=2))


def read_meta(folder: Path) -> dict[str, Any]:
    f = folder / META_FILE
    if not f.is_file():
        raise ClientError(400, f"{folder} holds no {META_FILE}: not a training state saved by hrl serve --tinker")
    return dict(json.loads(f.read_text()))


def _check(part: str, what: str) -> None:
    if not _PART.match(part) or ".." in part:
        raise ClientError(400, f"{what} {part!r}: letters, digits, ':', '.', '_' and '-' only")
