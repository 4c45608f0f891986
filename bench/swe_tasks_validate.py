"""Grade every task of the swe recipe in Docker, as `hrl tasks check` does, and record which rows passed.

python bench/swe_tasks_validate.py [--record tests/runners/tasks/swe_validated.json] [--concurrency 2]
    Each task: its gold patch scores 1, no patch 0 with every FAIL_TO_PASS test failing (runners/tasks/validate.py),
    in the grading image (`hrl sandbox build`). With --record, writes the sha256 of each passing task's row; the
    test suite checks that every committed row is in that record (so a task added or edited without this run is
    caught) and grades one task per repository in Docker for real. About 90 s for 40 tasks on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "recipes" / "swe" / "tasks.jsonl"
RECORD = ROOT / "tests" / "runners" / "tasks" / "swe_validated.json"


def row_digest(line: str) -> str:
    """A task row's sha256, over its JSON with sorted keys (so reformatting the file keeps it)."""
    return hashlib.sha256(json.dumps(json.loads(line), sort_keys=True).encode()).hexdigest()


def row_digests(path: Path = TASKS) -> dict[str, str]:
    """instance_id -> row_digest of every task row in `path`."""
    return {json.loads(line)["instance_id"]: row_digest(line) for line in path.read_text().splitlines() if line.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=Path, default=TASKS)
    parser.add_argument("--record", type=Path, nargs="?", const=RECORD, default=None, help="write the record here")
    parser.add_argument("--concurrency", type=int, default=max(2, min(8, (os.cpu_count() or 2) // 2)))
    args = parser.parse_args()

    from hrl.runners.tasks import load_tasks
    from hrl.runners.tasks.validate import validate_tasks_async

    t0 = time.monotonic()
    tasks = load_tasks(args.tasks)
    checks = asyncio.run(validate_tasks_async(tasks, sandbox="docker", concurrency=args.concurrency))
    bad = {c.instance_id: c.problems for c in checks if not c.ok}
    digests = row_digests(args.tasks)
    result = {
        "what": "the swe recipe's task rows whose gold patch scored 1 and empty patch 0 in Docker",
        "command": "python bench/swe_tasks_validate.py --record",
        "date": datetime.date.today().isoformat(),
        "seconds": round(time.monotonic() - t0, 1),
        "tasks": {c.instance_id: digests[c.instance_id] for c in checks if c.ok},
        "failed": bad,
    }
    shown = {k: v for k, v in result.items() if k not in ("tasks", "failed")}
    print(json.dumps(shown | {"passed": len(result["tasks"]), "failed": {k: v[0][:200] for k, v in bad.items()}}))
    if args.record and not bad:
        args.record.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
