"""Family × CLI table: every agent CLI driven through every model family, offline.

For each family, builds its tiny model (`hrl models tiny --family NAME`, cached in --models), checks that the proxy's
`tool_parser: auto` picks that family's parser, then runs `hrl agents doctor` on it: each installed CLI runs one
scripted episode whose turns the engine samples in that family's syntax (a tool call that writes a file, then an
answer) through the real proxy, and passes when it exits 0, the file is there and its trace extends token-exactly.

    python bench/families.py [--families hermes gpt-oss …] [--agents codex aider …] [--sandbox docker|local] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def family_model(family: str, models: Path) -> str:
    """The family's tiny model under `models` (built once: a dir with weights is reused)."""
    from hrl.train.tiny import build_tiny_model

    out = models / f"tiny-{family}"
    if (
        not (out / "model.safetensors").is_file()
        or json.loads((out / "config.json").read_text()).get("hrl_family") != family
    ):
        build_tiny_model(out, seed=0, family=family)
    return str(out)


def run(families: list[str], agents: list[str] | None, sandbox: str, models: Path) -> list[dict[str, Any]]:
    from hrl.runners.doctor.agents import doctor
    from hrl.runners.proxy.toolparsers import detect_model

    rows = []
    for family in families:
        model = family_model(family, models)
        t0 = time.monotonic()
        checks = doctor(agents, model, sandbox)  # type: ignore[arg-type]
        rows.append({
            "family": family, "parser": detect_model(model), "seconds": round(time.monotonic() - t0, 1),
            "agents": {c.name: {"ok": c.ok, "reason": c.reason, "seconds": c.seconds, **c.details} for c in checks},
        })  # fmt: skip
        print(f"{family}: " + " ".join(f"{c.name} {'✓' if c.ok else '✗'}" for c in checks), file=sys.stderr)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    names = list(dict.fromkeys(n for r in rows for n in r["agents"]))
    head = ["family", "parser", *names]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = ["✓" if r["agents"].get(n, {}).get("ok") else "✗" for n in names]
        lines.append("| " + " | ".join([r["family"], r["parser"], *cells]) + " |")
    failed = [f"{r['family']} × {n}: {a['reason']}" for r in rows for n, a in r["agents"].items() if not a["ok"]]
    return "\n".join(lines + (["", *failed] if failed else []))


def main() -> None:
    from hrl.train.tiny.families import FAMILIES

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--agents", nargs="+", default=None, help="CLIs to run (default: every installed one)")
    ap.add_argument("--sandbox", default="docker", choices=["docker", "local"])
    ap.add_argument("--models", type=Path, default=None, help="where the tiny models are built (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = run(a.families, a.agents, a.sandbox, a.models or Path(tmp))
    print(json.dumps(rows, indent=2) if a.json else table(rows))
    if not all(c["ok"] for r in rows for c in r["agents"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
