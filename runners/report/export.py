"""Traces in the formats other tools read: ATIF (Harbor's Agent Trajectory Interchange Format), one validated
trajectory file per trace with the images it references beside it; OTLP/JSON, one ExportTraceServiceRequest file
per trace file (`hrl export`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["copy_media", "export_run", "write_atif", "write_otlp"]

Say = Callable[[str], object]


def export_run(run: Any, sources: list[Path], fmt: str, out: Path, model: str | None, token_ids: bool, version: str,
               say: Say) -> dict[str, Any]:  # fmt: skip
    """`hrl export`: every trace of `run` (read from `sources`) written into `out` (created) as `fmt` (atif or
    otlp-json); with no trace, nothing is created (TraceFormatError). The summary: format, out, traces and the
    writer's own figures."""
    pairs = [(it.trace_file, t) for it in run.iterations for t in it.traces]
    if not pairs:
        from hrl.runners.trace import TraceFormatError

        raise TraceFormatError(f"no traces in {' '.join(map(str, sources))}: nothing to export")
    out.mkdir(parents=True, exist_ok=True)
    summary = write_atif(run, pairs, out, model, token_ids, say) if fmt == "atif" else write_otlp(run, out, version)
    return {"format": fmt, "out": str(out), "traces": len(pairs), **summary}


def write_atif(run: Any, pairs: list[tuple[Path | None, dict[str, Any]]], out: Path, model: str | None,
               token_ids: bool, say: Say) -> dict[str, Any]:  # fmt: skip
    """One validated ATIF file per trace in `out`; the tokenizer is loaded once, as `hrl inspect --trace` loads it.
    What the files lack (text, images, a schema check) is said to `say`."""
    from hrl.runners.conversation import decoding_template
    from hrl.runners.telemetry.atif import ATIF_VERSION, trajectory, validate

    traces = [t for _, t in pairs]
    template, note = decoding_template(traces, run.config, model)
    if note and traces:
        say(f"Note: {note}: the steps carry token counts without text (--model DIR decodes with that tokenizer)")
    files, checked, media = [], True, {"copied": 0, "missing": 0}
    for trace_file, t in pairs:
        traj = trajectory(t, template, note=note, token_ids=token_ids)
        checked = validate(traj) and checked
        path = out / f"{t['trace_id']}.json"
        path.write_text(json.dumps(traj, indent=1, ensure_ascii=False) + "\n")
        files.append(str(path))
        if template is not None:
            for k, n in copy_media(t, trace_file, out).items():
                media[k] += n
    if media["missing"]:
        say(
            f"Note: {media['missing']} image(s) the trajectories reference are not stored beside their traces "
            "(media/<sha256>): their image parts point at files that are not there"
        )
    if not checked:
        say("Note: jsonschema is not installed: checked the ATIF rules but not the schema (pip install jsonschema)")
    return {
        "schema_version": ATIF_VERSION,
        "files": files,
        "decoded": template is not None,
        "schema_checked": checked,
        "media": media,
    }


def copy_media(trace: dict[str, Any], trace_file: Path | None, out: Path) -> dict[str, int]:
    """The stored bytes of each image the trace's calls saw (`media/<sha256>` beside its trace file), copied to
    `out/media/` where the trajectories' image parts point; counts of those copied and those not found."""
    import shutil

    from hrl.runners.telemetry.atif import ATIF_IMAGE_TYPES

    counts = {"copied": 0, "missing": 0}
    shas = {m["sha256"] for c in trace.get("calls") or [] for m in c.get("media") or []
            if m.get("mime") in ATIF_IMAGE_TYPES}  # fmt: skip
    for sha in sorted(shas):
        if len(sha) != 64 or not all(ch in "0123456789abcdef" for ch in sha):  # a name, never a path
            counts["missing"] += 1
            continue
        dest = out / "media" / sha
        if dest.exists():
            continue
        source = trace_file.parent / "media" / sha if trace_file is not None else None
        if source is None or not source.is_file():
            counts["missing"] += 1
            continue
        dest.parent.mkdir(exist_ok=True)
        shutil.copyfile(source, dest)
        counts["copied"] += 1
    return counts


def write_otlp(run: Any, out: Path, version: str) -> dict[str, Any]:
    """One ExportTraceServiceRequest file per trace file in `out`, named after it (`iter-0003.otlp.json`), from hrl
    `version`; a run's metrics.jsonl gives each step's trainer version, hence `rl.staleness`."""
    from hrl.runners.report.run import trainer_version
    from hrl.runners.rundir import is_run_dir
    from hrl.runners.telemetry.otlp_json import export_request

    run_id = run.path.name if is_run_dir(run.path) else ""
    files = []
    for it in run.iterations:
        if not it.traces:
            continue
        name = it.trace_file.stem if it.trace_file is not None else f"iteration-{it.index}"
        pairs = [(it.trace_file, t) for t in it.traces]
        request = export_request(pairs, run_id=run_id, version=version, trainer_version=trainer_version(it.logged))
        path = out / f"{name}.otlp.json"
        path.write_text(json.dumps(request) + "\n")
        files.append(str(path))
    return {"files": files}
