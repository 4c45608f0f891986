"""The grading image: the base image plus a venv with pytest, built once and cached by tag.

`hrl/swe-py:bookworm` = `hrl/base:bookworm` + `/opt/swe` (a venv with pinned pytest) whose `python`, `pytest`
lead PATH and have wrappers in /usr/local/bin (so login shells, which reset PATH, find them too). There is no
registry to pull from:
the wheels are downloaded on the host with its own pip (its index, mirror and certificate settings apply) and
installed in the build with `--no-index`. When the host cannot download them, the build installs from the
index itself with `network_mode="host"`. The image carries the label `hrl.swe.packages`; a cached image whose
label differs from what is asked for is rebuilt.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hrl.runners.errors import PrerequisiteError
from hrl.runners.scratch import scratch

__all__ = ["BASE_IMAGE", "SWE_IMAGE", "SWE_PACKAGES", "ensure_image"]

BASE_IMAGE = "hrl/base:bookworm"
SWE_IMAGE = "hrl/swe-py:bookworm"
SWE_PACKAGES: tuple[str, ...] = ("pytest==8.4.2",)
LABEL = "hrl.swe.packages"
RECIPE = "2"  # bump when _DOCKERFILE changes: cached images with another recipe are rebuilt
VENV = "/opt/swe"

_DOCKERFILE = """\
FROM {base}
{copy}RUN python3 -m venv {venv} \\
 && {venv}/bin/pip install --no-cache-dir --disable-pip-version-check {source} {packages} \\
 && rm -rf /tmp/wheels && for b in python pytest; do printf '#!/bin/sh\\nexec {venv}/bin/%s "$@"\\n' $b \\
    > /usr/local/bin/$b && chmod 755 /usr/local/bin/$b; done
ENV PATH={venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL {label}="{label_value}"
"""


def ensure_image(
    tag: str = SWE_IMAGE,
    *,
    base: str = BASE_IMAGE,
    packages: Sequence[str] = SWE_PACKAGES,
    rebuild: bool = False,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> str:
    """Build `tag` from `base` with a venv holding `packages`, unless an image with that tag and package list
    exists. Returns the image id. Raises PrerequisiteError when Docker or the base image is missing or the
    build fails. Blocking (minutes on a first build); call it from a thread in async code."""
    import docker
    import docker.errors

    emit = on_event or (lambda event: None)
    label_value = " ".join([f"recipe={RECIPE}", *packages])
    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise PrerequisiteError(f"cannot reach the Docker daemon: {exc}", hint="start dockerd (.ci/setup.sh)") from exc
    try:
        if not rebuild:
            try:
                image = client.images.get(tag)
                if (image.labels or {}).get(LABEL) == label_value:
                    emit({"event": "image_cached", "tag": tag})
                    return str(image.id)
            except docker.errors.ImageNotFound:
                pass
        try:
            client.images.get(base)
        except docker.errors.ImageNotFound as exc:
            raise PrerequisiteError(
                f"base image {base!r} is missing", hint="hrl sandbox build (or .ci/setup.sh)"
            ) from exc
        emit({"event": "image_build", "tag": tag, "base": base, "packages": list(packages)})
        with scratch("image") as ctx:
            wheels = _download_wheels(packages, Path(ctx) / "wheels")
            dockerfile = _DOCKERFILE.format(
                base=base, venv=VENV, label=LABEL, label_value=label_value,
                copy="COPY wheels /tmp/wheels\n" if wheels else "",
                source="--no-index --find-links /tmp/wheels" if wheels else "",
                packages=" ".join(f"'{p}'" for p in packages),
            )  # fmt: skip
            (Path(ctx) / "Dockerfile").write_text(dockerfile)
            try:
                image, _ = client.images.build(
                    path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="host", pull=False
                )
            except docker.errors.BuildError as exc:
                log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
                raise PrerequisiteError(f"building {tag} failed: {exc}\n{log[-2000:]}") from exc
            except docker.errors.APIError as exc:
                raise PrerequisiteError(f"building {tag} failed: {exc}") from exc
        emit({"event": "image_built", "tag": tag, "id": image.id})
        return str(image.id)
    finally:
        client.close()


def _download_wheels(packages: Sequence[str], dest: Path) -> bool:
    """Download pure-Python wheels for `packages` (and their dependencies) with the host's pip; False if it cannot."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest)]
    cmd += ["--python-version", "3.11", "--platform", "any", "--implementation", "py", *packages]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return False
    return any(dest.glob("*.whl"))
