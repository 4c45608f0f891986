"""Reading tasks from every source hrl takes: JSONL, JSON or Parquet files of SWE-bench-format tasks (`task`),
folders of Harbor tasks (`harbor`) and MiniWoB++ pages (`miniwob`); and the one-row summary of a task
(`hrl tasks ls`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hrl.runners.errors import PrerequisiteError, UsageError
from hrl.runners.tasks.harbor import HarborTask, image_tag, load_harbor_tasks
from hrl.runners.tasks.swebench import adapt_row
from hrl.runners.tasks.task import DEFAULT_IMAGE, Task, TaskFormatError

__all__ = ["TaskFileNotFoundError", "load_tasks", "task_summary"]


class TaskFileNotFoundError(UsageError, TaskFormatError):
    """The task file named does not exist: a usage error (the path is wrong), and a TaskFormatError for callers."""


def load_tasks(path: str | Path) -> list[Task]:
    """Read tasks from JSONL (`.jsonl`, or any other name), a JSON array (`.json`), or Parquet (`.parquet`); a
    folder is Harbor task directories (`hrl.runners.tasks.harbor`); `miniwob:NAME[,NAME…][:SEEDS]` is MiniWoB++ pages
    (`hrl.runners.tasks.miniwob`).

    Raises TaskFormatError naming the file and line (row) of the first bad task, and PrerequisiteError for
    Parquet without pyarrow."""
    if str(path).startswith("miniwob:"):  # MiniWoB++ pages from the miniwob package (which loads aiohttp)
        from hrl.runners.tasks.miniwob import load_miniwob

        return load_miniwob(str(path))
    path = Path(path)
    if path.is_dir():  # a Harbor task folder, or a dataset of them
        return list(load_harbor_tasks(path))
    if not path.is_file():
        raise TaskFileNotFoundError(
            f"task file {path} does not exist",
            hint="give a JSONL, JSON or Parquet file of SWE-bench tasks; `hrl recipes show swe` names the swe recipe's",
        )
    if path.suffix == ".parquet":
        rows: Iterable[tuple[int, Any]] = enumerate(_parquet_rows(path), 1)
    elif path.suffix == ".json":
        rows = enumerate(_json_load(path, path.read_text()), 1)
    else:
        rows = ((n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip())
    tasks: list[Task] = []
    seen: set[str] = set()
    for lineno, row in rows:
        where = f"{path}:{lineno}"
        obj = adapt_row(_json_load(where, row) if isinstance(row, str) else row)
        try:
            task = Task.model_validate(obj)
        except ValidationError as exc:
            name = obj.get("instance_id", "?") if isinstance(obj, dict) else "?"
            raise TaskFormatError(f"{where}: task {name!r} is not valid: {_first_error(exc)}") from exc
        if task.instance_id in seen:
            raise TaskFormatError(f"{where}: duplicate instance_id {task.instance_id!r}")
        seen.add(task.instance_id)
        tasks.append(task)
    return tasks


def task_summary(task: Task) -> dict[str, Any]:
    """One row for `hrl tasks ls`."""
    return {
        "instance_id": task.instance_id,
        "repo": task.repo,
        "version": task.version,
        "fail_to_pass": len(task.FAIL_TO_PASS),
        "pass_to_pass": len(task.PASS_TO_PASS),
        "snapshot": "none" if task.repo_snapshot is None else type(task.repo_snapshot).__name__,
        "image": task.image or _harbor_image(task) or DEFAULT_IMAGE,
    }


def _harbor_image(task: Task) -> str | None:
    return image_tag(task) if isinstance(task, HarborTask) else None


def _json_load(where: str | Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskFormatError(f"{where}: not JSON: {exc}") from exc


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise PrerequisiteError(
            f"reading {path} needs pyarrow, which is not installed", hint="pip install pyarrow (or convert to JSONL)"
        ) from exc
    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc']) or 'task'}: {err['msg'].removeprefix('Value error, ')}"
