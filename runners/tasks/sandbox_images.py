"""hrl's own images, built on the base image once and cached by tag: the grading image (a venv with pytest) and
the browser image (Chromium, for browser tasks).

`hrl/swe-py:bookworm` = `hrl/base:bookworm` + `/opt/swe` (a venv with pinned pytest) whose `python`, `pytest`
lead PATH and have wrappers in /usr/local/bin (so login shells, which reset PATH, find them too). There is no
registry to pull from:
the wheels are downloaded on the host with its own pip (its index, mirror and certificate settings apply) and
installed in the build with `--no-index`. When the host cannot download them, the build installs from the
index itself with `network_mode="host"`. The image carries the label `hrl.swe.packages`; a cached image whose
label differs from what is asked for is rebuilt.

`hrl/browser:bookworm` = `hrl/base:bookworm` + Debian's Chromium (apt, in the build): one headless browser per
browser-task episode runs in a container of it, with no network (runners/browser/).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hrl.runners.errors import PrerequisiteError
from hrl.runners.scratch import scratch

__all__ = [
    "BASE_IMAGE",
    "BROWSER_IMAGE",
    "SWE_IMAGE",
    "SWE_PACKAGES",
    "build_images",
    "ensure_browser_image",
    "ensure_image",
]

BASE_IMAGE = "hrl/base:bookworm"
SWE_IMAGE = "hrl/swe-py:bookworm"
SWE_PACKAGES: tuple[str, ...] = ("pytest==8.4.2",)
LABEL = "hrl.swe.packages"
RECIPE = "2"  # bump when _DOCKERFILE changes: cached images with another recipe are rebuilt
VENV = "/opt/swe"

BROWSER_IMAGE = "hrl/browser:bookworm"
BROWSER_LABEL = "hrl.browser"
BROWSER_RECIPE = "1"  # bump when _BROWSER_DOCKERFILE changes
_BROWSER_DOCKERFILE = """\
FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends chromium fonts-liberation \\
 && rm -rf /var/lib/apt/lists/*
LABEL {label}="{label_value}"
"""

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
    emit = on_event or (lambda event: None)
    label_value = " ".join([f"recipe={RECIPE}", *packages])
    with _docker() as client:
        if (cached := _cached(client, tag, LABEL, label_value, rebuild, emit)) is not None:
            return cached
        _need_base(client, base)
        emit({"event": "image_build", "tag": tag, "base": base, "packages": list(packages)})
        with scratch("image") as ctx:
            wheels = _download_wheels(packages, Path(ctx) / "wheels")
            dockerfile = _DOCKERFILE.format(
                base=base, venv=VENV, label=LABEL, label_value=label_value,
                copy="COPY wheels /tmp/wheels\n" if wheels else "",
                source="--no-index --find-links /tmp/wheels" if wheels else "",
                packages=" ".join(f"'{p}'" for p in packages),
            )  # fmt: skip
            return _build(client, Path(ctx), dockerfile, tag, emit)


def ensure_browser_image(
    tag: str = BROWSER_IMAGE,
    *,
    base: str = BASE_IMAGE,
    rebuild: bool = False,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> str:
    """Build `tag` from `base` with Debian's Chromium (apt in the build, a minute or so), unless it exists. Returns
    the image id; raises PrerequisiteError as `ensure_image` does. Blocking."""
    emit = on_event or (lambda event: None)
    label_value = f"recipe={BROWSER_RECIPE}"
    with _docker() as client:
        if (cached := _cached(client, tag, BROWSER_LABEL, label_value, rebuild, emit)) is not None:
            return cached
        _need_base(client, base)
        emit({"event": "image_build", "tag": tag, "base": base, "packages": ["chromium"]})
        with scratch("image") as ctx:
            dockerfile = _BROWSER_DOCKERFILE.format(base=base, label=BROWSER_LABEL, label_value=label_value)
            return _build(client, Path(ctx), dockerfile, tag, emit)


def build_images(rebuild: bool, browser: bool, on_event: Callable[[dict[str, Any]], None]) -> Iterator[str]:
    """`hrl sandbox build`: the grading image and, with `browser`, the browser image, each image's id as its build
    ends (in that order). The base image ($HRL_BASE_IMAGE) and the Docker daemon are checked first."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import docker

    base = os.environ.get("HRL_BASE_IMAGE", "hrl/base:bookworm")
    try:
        docker.from_env().images.get(base)
    except docker.errors.ImageNotFound as e:
        raise PrerequisiteError(
            f"base image {base} is missing", hint="build it with `make setup` (debootstrap, no registry needed)"
        ) from e
    except docker.errors.DockerException as e:
        raise PrerequisiteError(f"no Docker daemon: {e}", hint="start dockerd (`make setup` does)") from e
    # The two builds share nothing but the base image, and each mostly waits on its downloads: side by side.
    with ThreadPoolExecutor(2) as pool:
        builds = [pool.submit(ensure_image, rebuild=rebuild, on_event=on_event)]
        if browser:
            builds.append(pool.submit(ensure_browser_image, rebuild=rebuild, on_event=on_event))
        for build in builds:
            yield build.result()  # a failed build raises here, as it would have alone


@contextlib.contextmanager
def _docker() -> Iterator[Any]:
    import docker
    import docker.errors

    try:
        client = docker.from_env(timeout=600)
        client.ping()
    except docker.errors.DockerException as exc:
        raise PrerequisiteError(f"cannot reach the Docker daemon: {exc}", hint="start dockerd (.ci/setup.sh)") from exc
    try:
        yield client
    finally:
        client.close()


def _cached(
    client: Any, tag: str, label: str, value: str, rebuild: bool, emit: Callable[[dict[str, Any]], None]
) -> str | None:
    """The id of image `tag` if it exists with `label` = `value` (and no rebuild is asked for)."""
    import docker.errors

    if rebuild:
        return None
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    if (image.labels or {}).get(label) != value:
        return None
    emit({"event": "image_cached", "tag": tag})
    return str(image.id)


def _need_base(client: Any, base: str) -> None:
    import docker.errors

    try:
        client.images.get(base)
    except docker.errors.ImageNotFound as exc:
        raise PrerequisiteError(f"base image {base!r} is missing", hint="hrl sandbox build (or .ci/setup.sh)") from exc


def _build(client: Any, ctx: Path, dockerfile: str, tag: str, emit: Callable[[dict[str, Any]], None]) -> str:
    import docker.errors

    (ctx / "Dockerfile").write_text(dockerfile)
    try:
        image, _ = client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True, network_mode="host", pull=False)
    except docker.errors.BuildError as exc:
        log = "".join(str(chunk.get("stream", chunk.get("error", ""))) for chunk in exc.build_log)
        raise PrerequisiteError(f"building {tag} failed: {exc}\n{log[-2000:]}") from exc
    except docker.errors.APIError as exc:
        raise PrerequisiteError(f"building {tag} failed: {exc}") from exc
    emit({"event": "image_built", "tag": tag, "id": image.id})
    return str(image.id)


def _download_wheels(packages: Sequence[str], dest: Path) -> bool:
    """Download pure-Python wheels for `packages` (and their dependencies) with the host's pip; False if it cannot."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", str(dest)]
    cmd += ["--python-version", "3.11", "--platform", "any", "--implementation", "py", *packages]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError):
        return False
    return any(dest.glob("*.whl"))
