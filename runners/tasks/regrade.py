"""Regrading: each finished episode's archived final state graded again by its verifier, and compared with the
reward its trace recorded (`hrl regrade`).

What regrading needs is archived as an episode ends (`archive_episode`), in a folder beside its trace file
(`archive_dir`: `traces.jsonl` -> `traces.archive/`), content-addressed so that a task is stored once however
many episodes ran it:

    traces.archive/tasks/<sha256>.json    the task as graded (hidden tests and gold patch: the folder is hidden
                                          from every sandbox, as the trace file is)
    traces.archive/patches/<sha256>.diff  the agent's whole diff, when it is longer than the trace's inline
                                          `metadata.patch` (PATCH_INLINE characters)

The trace's `metadata.archive` names them relative to the trace file's folder, with the verifier's settings:
`{"verifier": {"name": "tests", …}, "task": "traces.archive/tasks/….json", "patch": "…diff" (when not inline)}`.
A Harbor episode archives its task the same way (its `task_dir` leads back to tests/); its final state is the
agent's container, committed and kept as the image the trace's `reward_info.final_image` names
(`hrl/harbor-final:<id>`, verifier setting `keep_final`; carry: workdir keeps the clean image with its workdir).
Regrading runs tests/test.sh again in a fresh container of it; an episode whose image was removed is set apart.
A MiniWoB++ episode archives its task the same way; its final state is the inputs its page received, recorded by
the verifier (`miniwob_replay`) and kept as its `patch` (JSON, archived like a long diff when it does not fit
inline, `.json`). Regrading replays them on a fresh page of the task and seed and reads the page's reward again.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hrl.config import DEFAULT_VERIFIER
from hrl.runners.durable import write_atomically
from hrl.runners.errors import HrlError, UsageError
from hrl.runners.redact import default_redactor
from hrl.runners.rundir import RunDir, is_run_dir
from hrl.runners.tasks.task import Task

__all__ = [
    "PATCH_INLINE",
    "Episode",
    "Regrade",
    "apart_line",
    "archive_dir",
    "archive_episode",
    "archived",
    "collect",
    "regradable",
    "regrade",
    "trace_files",
]

PATCH_INLINE = 20_000  # characters of the agent's diff kept in the trace itself (metadata.patch)
_PRIVATE = ("hide_paths", "run_id")  # verifier settings of the host and the run, not of grading
# the verifiers whose episodes archive their task, and the suffix of their final state when it is archived apart
# from the trace (None: a Harbor episode's final state is its kept image)
_ARCHIVED = {"tests": ".diff", "harbor": None, "miniwob": ".json"}
_REPLAYED = ("harbor", "miniwob")  # regraded from a final state of their own (`verifier.regrade`), not a diff


def archive_dir(trace_file: str | Path) -> Path:
    """Where the episodes of `trace_file` archive their tasks and long diffs: `<stem>.archive/` beside it."""
    path = Path(trace_file)
    return path.with_name(f"{path.stem}.archive")


def archive_episode(trace_file: Path, task: Task, verifier: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` (the trace's metadata) with what regrading the episode needs: `archive` naming the verifier's
    settings and, for the tests, harbor and miniwob verifiers, the archived task and, when it does not fit inline,
    the whole final state (the diff, the page's inputs; `patch` keeps its first PATCH_INLINE characters)."""
    settings = {k: v for k, v in verifier.items() if k not in _PRIVATE}
    settings.setdefault("name", DEFAULT_VERIFIER)
    archive: dict[str, Any] = {"verifier": settings}
    patch = str(extra.get("patch") or "")
    if settings["name"] in _ARCHIVED:
        folder = archive_dir(trace_file)
        archive["task"] = _store(folder / "tasks", task.model_dump_json(), ".json", trace_file.parent)
        if len(patch) > PATCH_INLINE and (suffix := _ARCHIVED[settings["name"]]):
            archive["patch"] = _store(folder / "patches", default_redactor().text(patch), suffix, trace_file.parent)
    return {**extra, "patch": patch[:PATCH_INLINE], "archive": archive}


async def archived(trace_file: Path, task: Task, verifier: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`archive_episode` off the event loop; a failure to write the archive is noted in the trace (`archive_error`,
    the inline diff cut as usual), never a lost episode."""
    try:
        return await asyncio.to_thread(archive_episode, trace_file, task, verifier, extra)
    except OSError as e:
        return {**extra, "patch": str(extra.get("patch") or "")[:PATCH_INLINE], "archive_error": str(e)[:500]}


def _store(folder: Path, text: str, suffix: str, base: Path) -> str:
    """Write `text` once under its content hash; its path relative to `base`."""
    path = folder / f"{hashlib.sha256(text.encode('utf-8', 'surrogateescape')).hexdigest()}{suffix}"
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)
    return path.relative_to(base).as_posix()


# ---- reading a run back ---------------------------------------------------------------------------------------


@dataclass
class Episode:
    """One trace, as regrading sees it: what to grade, or why it is set apart."""

    file: str
    trace_id: str
    episode: str
    task_id: str | None
    recorded: float | None
    sandbox: str = "local"
    verifier: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None
    patch: str = ""
    apart: str = ""  # "grading_failed" | "not_graded" | "not_regradable"; "" = to regrade
    why: str = ""
    regraded: float | None = None
    recorded_success: bool | None = None  # the trace's `success` (absent in older traces: reward == 1)
    regraded_success: bool | None = None
    regraded_info: dict[str, Any] = field(default_factory=dict)
    recorded_info: dict[str, Any] = field(default_factory=dict)

    @property
    def agrees(self) -> bool:
        return self.regraded is not None and self.regraded == self.recorded

    def row(self) -> dict[str, Any]:
        """The episode for `--json`: no task or patch (they are in the archive)."""
        row = {k: v for k, v in asdict(self).items() if k not in ("task", "patch", "regraded_info", "recorded_info")}
        row["verifier"] = self.verifier.get("name")
        return row


def trace_files(source: str | Path) -> list[Path]:
    """A run directory's trace files (traces/ and its held-out evaluations in eval/), or the one file given."""
    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"no run directory or trace file at {path}")
    if path.is_file():
        return [path]
    run = RunDir.existing(path)
    files = sorted(run.traces.glob("*.jsonl")) + sorted((run.path / "eval").glob("*.jsonl"))
    if not files:
        raise UsageError(f"{path} holds no trace files (traces/*.jsonl)", hint="give a run directory that has run")
    return files


def collect(source: str | Path) -> list[Episode]:
    """Every episode of `source` (a run directory or a trace file), each ready to regrade or set apart saying why."""
    from hrl.runners.trace import read_traces

    fallback = _run_fallback(Path(source))
    return [_episode(f, t, fallback) for f in trace_files(source) for t in read_traces(f)]


def regradable(source: Path) -> tuple[list[Episode], list[str]]:
    """`collect(source)`, refused when nothing in it can be regraded, and the paths no grading sandbox may read:
    the trace files and their archives (hidden tests), and a run directory whole."""
    files = trace_files(source)
    episodes = collect(source)
    if not episodes:  # an empty file: nothing disagrees, and nothing agrees either
        raise UsageError(
            f"{source} holds no trace: nothing to regrade",
            hint="give a trace file with traces (the --out of `hrl rollout`) or a run directory that has run",
        )
    if all(e.apart for e in episodes):
        raise HrlError(f"no episode of {source} can be regraded ({apart_line(episodes)})",
                       hint="regrading needs episodes graded by the tests, harbor or miniwob verifier, written by this hrl")  # fmt: skip
    hide = [str(p.resolve()) for f in files for p in (f, archive_dir(f))]
    if source.is_dir():
        hide.append(str(source.resolve()))
    return episodes, hide


def apart_line(episodes: list[Episode]) -> str:
    """How many were set apart, and why, on one line."""
    parts = []
    for kind, label in (("grading_failed", "grading failed when recorded"), ("not_graded", "never graded"),
                        ("not_regradable", "not regradable")):  # fmt: skip
        whys = sorted({e.why for e in episodes if e.apart == kind})
        if count := sum(e.apart == kind for e in episodes):
            parts.append(f"{count} {label} ({'; '.join(whys)})")
    return ", ".join(parts)


def _run_fallback(source: Path) -> dict[str, Any]:
    """For traces written before episodes archived their task: the run directory's verifier section and tasks."""
    if not (source.is_dir() and is_run_dir(source)):
        return {}
    config = RunDir(source).config()
    tasks: dict[str, Task] = {}
    from hrl.runners.tasks.load import load_tasks

    for key in ("tasks", "eval_tasks"):
        if config.get(key) and Path(config[key]).is_file():
            tasks.update({t.instance_id: t for t in load_tasks(config[key])})
    return {"verifier": dict(config.get("verifier") or {}), "tasks": tasks}


def _episode(file: Path, trace: dict[str, Any], fallback: dict[str, Any]) -> Episode:
    meta = trace.get("metadata") or {}
    ep = Episode(
        file=str(file), trace_id=str(trace.get("trace_id")), episode=str(meta.get("episode") or trace.get("trace_id")),
        task_id=trace.get("task_id"), recorded=trace.get("reward"),
        sandbox=str((trace.get("env") or {}).get("sandbox") or "local"),
        recorded_info=dict(trace.get("reward_info") or {}),
        recorded_success=trace["success"] if "success" in trace else _success_of(trace.get("reward")),
    )  # fmt: skip
    if ep.recorded is None:
        grading_failed = trace.get("failure_reason") == "verifier_error"
        ep.apart = "grading_failed" if grading_failed else "not_graded"
        ep.why = str(trace.get("failure_reason") or "no reward recorded")
        return ep
    archive = meta.get("archive")
    if archive is None:
        return _from_fallback(ep, meta, fallback)
    ep.verifier = {k: v for k, v in archive.get("verifier", {}).items() if k not in _PRIVATE}
    name = ep.verifier.get("name", "")
    if name not in _ARCHIVED:
        return _unregradable(ep, _NOT_ARCHIVED.get(name, _OTHER).format(name))
    try:  # the archived task, and the final state: the diff or the page's inputs (inline when short)
        ep.task = Task.model_validate_json((file.parent / archive["task"]).read_text())
        ep.patch = (file.parent / archive["patch"]).read_text() if "patch" in archive else str(meta.get("patch") or "")
    except (OSError, KeyError, ValueError) as e:
        return _unregradable(ep, f"its archive cannot be read ({type(e).__name__}: {e})")
    if name == "harbor":  # its final state is the kept image its trace names (`ep.patch` holds the tag)
        if not (image := ep.recorded_info.get("final_image")):
            return _unregradable(ep, _NOT_ARCHIVED["harbor"])
        ep.patch = str(image)
    elif name == "miniwob" and not ep.patch:
        why = ep.recorded_info.get("inputs_error") or "written by an hrl that did not record them"
        return _unregradable(ep, f"the inputs its page received were not recorded ({why})")
    return ep


def _success_of(reward: float | None) -> bool | None:
    """The trace format's fallback where no `success` was recorded: reward == 1 (no reward: no grade)."""
    return None if reward is None else reward == 1.0


_NOT_ARCHIVED = {
    "harbor": "a Harbor episode whose trace names no kept final image (keep_final: false, or an older hrl): it "
    "cannot be regraded (its recorded reward stands unchecked)",
    "python": "a python verifier scores the agent's last reply, which the trace keeps as token ids only",
}
_OTHER = "verifier {} has no archived final state to regrade"


def _unregradable(ep: Episode, why: str) -> Episode:
    ep.apart, ep.why = "not_regradable", why
    return ep


def _from_fallback(ep: Episode, meta: dict[str, Any], fallback: dict[str, Any]) -> Episode:
    """An episode recorded before tasks were archived: its task from the run's task files, its inline diff when that
    is whole (shorter than the cut)."""
    task = fallback.get("tasks", {}).get(ep.task_id)
    patch = str(meta.get("patch") or "")
    if task is None:
        return _unregradable(ep, "its trace archives no task (written by an older hrl) and no task file of the run "
                             "holds it")  # fmt: skip
    if len(patch) >= PATCH_INLINE:
        return _unregradable(ep, f"its diff was cut at {PATCH_INLINE} characters (written by an older hrl)")
    ep.verifier = {k: v for k, v in fallback.get("verifier", {}).items() if k not in _PRIVATE}
    if ep.verifier.get("name", DEFAULT_VERIFIER) != DEFAULT_VERIFIER:
        return _unregradable(ep, _NOT_ARCHIVED.get(ep.verifier["name"], _OTHER).format(ep.verifier["name"]))
    ep.task, ep.patch = task, patch
    return ep


# ---- grading again --------------------------------------------------------------------------------------------


@dataclass
class Regrade:
    """The outcome: agreement over the episodes regraded, every disagreement, and the episodes set apart."""

    episodes: list[Episode]

    @property
    def regraded(self) -> list[Episode]:
        return [e for e in self.episodes if not e.apart]

    @property
    def disagreements(self) -> list[Episode]:
        return [e for e in self.regraded if e.regraded is not None and not e.agrees]

    @property
    def errors(self) -> list[Episode]:
        """Episodes whose regrading itself failed (a grading sandbox, a test command without results)."""
        return [e for e in self.regraded if e.regraded is None]

    def apart(self, kind: str) -> list[Episode]:
        return [e for e in self.episodes if e.apart == kind]

    @property
    def agreement(self) -> float | None:
        graded = [e for e in self.regraded if e.regraded is not None]
        return sum(e.agrees for e in graded) / len(graded) if graded else None

    def summary(self) -> dict[str, Any]:
        graded = [e for e in self.regraded if e.regraded is not None]
        return {
            "episodes": len(self.episodes), "regraded": len(graded), "agreed": sum(e.agrees for e in graded),
            "agreement": self.agreement, "disagreements": [e.row() for e in self.disagreements],
            "regrade_errors": [e.row() for e in self.errors],
            "grading_failed": [e.row() for e in self.apart("grading_failed")],
            "not_graded": [e.row() for e in self.apart("not_graded")],
            "not_regradable": [e.row() for e in self.apart("not_regradable")],
        }  # fmt: skip

    def text(self) -> str:
        """The outcome in words (`hrl regrade`): the agreement, each disagreement and regrade error, what was apart."""
        summary = self.summary()
        rate = "-" if summary["agreement"] is None else f"{summary['agreement']:.2f}"
        lines = [f"agreement {rate} ({summary['agreed']}/{summary['regraded']})"]
        if self.disagreements:
            lines.append(f"{len(self.disagreements)} disagreements:")
            lines += [_line(e) for e in self.disagreements]
        if self.errors:
            lines.append(f"{len(self.errors)} could not be regraded (grading failed now):")
            lines += [_line(e) for e in self.errors]
        if apart := apart_line(self.episodes):
            lines.append(f"counted apart: {apart}")
        return "\n".join(lines)


def _line(ep: Episode) -> str:
    regraded = "-" if ep.regraded is None else f"{ep.regraded:g}"
    return f"  {ep.episode}  task {ep.task_id}  recorded {ep.recorded:g}  regraded {regraded}  {ep.why}"


async def regrade(
    episodes: Iterable[Episode],
    *,
    sandbox: str = "",
    concurrency: int = 4,
    hide_paths: Iterable[str] = (),
    on_done: Callable[[Episode], None] = lambda ep: None,
) -> Regrade:
    """Grade each regradable episode's archived diff against its archived task again, in fresh sandboxes of
    `sandbox` (default: the one it ran in), at most `concurrency` at once. `hide_paths`: what no grading sandbox may
    read (the archives, with their hidden tests)."""
    from hrl.runners.tasks import make_verifier
    from hrl.sandboxes import get_backend

    episodes = list(episodes)
    gate, verifiers = asyncio.Semaphore(concurrency), {}

    def verifier_of(ep: Episode) -> Any:
        """One verifier per (sandbox, settings), shared by the episodes graded alike."""
        key = (sandbox or ep.sandbox, repr(sorted(ep.verifier.items())))
        if key not in verifiers:
            options = {k: v for k, v in ep.verifier.items() if k != "name"}
            verifiers[key] = make_verifier(ep.verifier.get("name", DEFAULT_VERIFIER), get_backend(key[0]), run_id="hrl-regrade",
                                           hide_paths=list(hide_paths), **options)  # fmt: skip
        return verifiers[key]

    async def one(ep: Episode, verifier: Any) -> None:
        async with gate:
            assert ep.task is not None
            try:
                verdict = await (verifier.regrade if verifier.name in _REPLAYED else verifier.grade)(ep.task, ep.patch)
            except FileNotFoundError as e:  # a Harbor episode's kept image is gone: nothing to regrade
                _unregradable(ep, str(e))
                on_done(ep)
                return
        ep.regraded, ep.regraded_info = verdict.reward, dict(verdict.reward_info)
        ep.regraded_success = verdict.success
        ep.why = _why(ep) if ep.regraded is None or not ep.agrees else ""
        on_done(ep)

    await asyncio.gather(*(one(ep, verifier_of(ep)) for ep in episodes if not ep.apart))
    return Regrade(episodes)


_COUNTS = ("fail_to_pass", "pass_to_pass")


def _why(ep: Episode) -> str:
    """What the regrade saw differently: the tests whose outcome changed, else the grader's own reason."""
    now = ep.regraded_info
    if ep.regraded is None:
        return str(now.get("error") or "grading failed")
    before, after = ep.recorded_info.get("tests") or {}, now.get("tests") or {}
    changed = [f"{t}: {before.get(t, '?')} -> {after[t]}" for t in after if before and before.get(t) != after[t]]
    if changed:
        return "; ".join(changed[:5]) + (f" (and {len(changed) - 5} more)" if len(changed) > 5 else "")
    for key in ("patch_error", "guard", "timeout", "diff_error"):
        if now.get(key):
            return f"{key}: {now[key]}"
    if "ended" in now:  # a page's reward (miniwob)
        then = ep.recorded_info.get("raw_reward", "no end" if ep.recorded_info.get("ended") is False else "?")
        return (
            f"the replayed inputs end the page with raw score {now.get('raw_reward', 'no end')} "
            f"(recorded: {then}; {now.get('replayed_inputs', '?')} inputs replayed)"
        )
    counts = ", ".join(f"{k} {now[k]['passed']}/{now[k]['total']}" for k in _COUNTS if k in now)
    same = (
        ": the recorded test outcomes are these, so the recorded reward does not follow from them"
        if (before and before == after)
        else ""
    )
    return f"the tests now give {ep.regraded:g} ({counts}){same}"
