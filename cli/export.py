"""`hrl export TRACES|RUN --format atif|otlp-json`: traces in the formats other tools read. ATIF (Harbor's Agent
Trajectory Interchange Format): one trajectory file per trace, decoded to text, sub-agents as embedded
sub-trajectories, each checked against the ATIF schema. OTLP/JSON: one ExportTraceServiceRequest file per trace
file, the spans the live OTLP exporter sends (`gen_ai.*`, `rl.*`, no token ids)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from hrl.cli.options import DecodeModelOption
from hrl.cli.output import emit, err

__all__ = ["EPILOG", "FORMATS", "export"]

FORMATS = ("atif", "otlp-json")

EPILOG = """Examples:

  hrl export traces.jsonl --format atif --out atif/          # one ATIF trajectory per trace: atif/<trace_id>.json

  hrl export runs/demo --format atif -m Qwen/Qwen3-8B         # every iteration of a run, decoded with that tokenizer

  hrl export traces.jsonl --format atif --token-ids           # + each call's token ids and logprobs

  hrl export runs/demo --format otlp-json --out otlp/         # OTLP/JSON spans, one file per trace file

  hrl export traces.jsonl --format otlp-json --json | jq '.files[]'
"""


def export(
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="TRACES...|RUN_DIR", help="hrl.trace/1 JSONL files (or a folder of them), or a run directory."
        ),
    ],
    fmt: Annotated[str, typer.Option("--format", "-f", help="atif | otlp-json.")] = "atif",
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder to write into (created if missing).")] = Path(
        "export"
    ),
    model: DecodeModelOption = None,
    token_ids: Annotated[
        bool, typer.Option("--token-ids", help="atif: also each call's prompt and completion ids and logprobs.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary (format, out, files, traces).")] = False,
) -> None:
    """Write traces as ATIF trajectories or as OTLP/JSON spans. ATIF: each model call an agent step (reply text,
    reasoning, tool calls, token counts), tool results its observation, sub-agents embedded sub-trajectories, reward
    and success in the final metrics; every file is validated against the ATIF v1.8 schema. OTLP/JSON: an episode
    span per trace with a child per model call and tool event (gen_ai.* and rl.* attributes, never token ids), the
    same spans `--otlp` sends live."""
    from hrl.cli.report import warn_cut_lines
    from hrl.runners.errors import UsageError
    from hrl.runners.report.run import load_source

    if fmt not in FORMATS:
        raise UsageError(
            f"unknown --format {fmt!r}: one of {', '.join(FORMATS)}", hint="`hrl export TRACES --format atif`"
        )
    if (model or token_ids) and fmt != "atif":
        raise UsageError("--model and --token-ids apply to --format atif only", hint="drop them for --format otlp-json")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a folder", hint="give a folder for --out (created if missing)")
    run = load_source(sources)
    warn_cut_lines(run)
    pairs = [(it.trace_file, t) for it in run.iterations for t in it.traces]
    if not pairs:  # nothing written, nothing created: exit 1
        from hrl.runners.trace import TraceFormatError

        raise TraceFormatError(f"no traces in {' '.join(map(str, sources))}: nothing to export")
    out.mkdir(parents=True, exist_ok=True)
    summary = _atif(run, pairs, out, model, token_ids) if fmt == "atif" else _otlp(run, out)
    summary = {"format": fmt, "out": str(out), "traces": len(pairs), **summary}
    emit(summary, as_json=as_json, human=_human(summary))


def _atif(run: Any, pairs: list[tuple[Path | None, dict[str, Any]]], out: Path, model: str | None,
          token_ids: bool) -> dict[str, Any]:  # fmt: skip
    """One validated ATIF file per trace; the tokenizer is loaded once, as `hrl inspect --trace` loads it."""
    from hrl.runners.conversation import load_template, model_of
    from hrl.runners.errors import UsageError
    from hrl.runners.telemetry.atif import ATIF_VERSION, trajectory, validate

    traces = [t for _, t in pairs]
    template, note = load_template(model or model_of(traces, run.config), run.config.get("proxy"))
    if template is None and model is not None:
        raise UsageError(f"cannot decode with --model {model}: {note}", hint="give a model directory or a cached HF id")
    if note and traces:
        err.print(f"Note: {note}: the steps carry token counts without text (--model DIR decodes with that tokenizer)",
                  markup=False, highlight=False)  # fmt: skip
    files, checked, media = [], True, {"copied": 0, "missing": 0}
    for trace_file, t in pairs:
        traj = trajectory(t, template, note=note, token_ids=token_ids)
        checked = validate(traj) and checked
        path = out / f"{t['trace_id']}.json"
        path.write_text(json.dumps(traj, indent=1, ensure_ascii=False) + "\n")
        files.append(str(path))
        if template is not None:
            for k, n in _copy_media(t, trace_file, out).items():
                media[k] += n
    if media["missing"]:
        err.print(f"Note: {media['missing']} image(s) the trajectories reference are not stored beside their traces "
                  "(media/<sha256>): their image parts point at files that are not there", markup=False,
                  highlight=False)  # fmt: skip
    if not checked:
        err.print("Note: jsonschema is not installed: checked the ATIF rules but not the schema (pip install jsonschema)",
                  markup=False, highlight=False)  # fmt: skip
    return {
        "schema_version": ATIF_VERSION,
        "files": files,
        "decoded": template is not None,
        "schema_checked": checked,
        "media": media,
    }


def _copy_media(trace: dict[str, Any], trace_file: Path | None, out: Path) -> dict[str, int]:
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


def _otlp(run: Any, out: Path) -> dict[str, Any]:
    """One ExportTraceServiceRequest file per trace file, named after it (`iter-0003.otlp.json`); a run's
    metrics.jsonl gives each step's trainer version, hence `rl.staleness`."""
    from hrl.cli import __version__
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
        request = export_request(pairs, run_id=run_id, version=__version__, trainer_version=trainer_version(it.logged))
        path = out / f"{name}.otlp.json"
        path.write_text(json.dumps(request) + "\n")
        files.append(str(path))
    return {"files": files}


def _human(s: dict[str, Any]) -> str:
    what = "ATIF trajectories" if s["format"] == "atif" else "OTLP/JSON files"
    line = f"wrote {len(s['files'])} {what} ({s['traces']} traces) to {s['out']}"
    if s["format"] == "atif":
        line += f", each valid {s['schema_version']}" + ("" if s["schema_checked"] else " (rules only: no jsonschema)")
    return line
