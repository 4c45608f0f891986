"""`hrl top` shows where a Ray run's pieces ran, from the placement.json the run writes into its directory: the driver,
each trainer rank and each engine replica with its node (id cut to 12 characters), IP and devices, in the view and in
`--once --json`; a run without the file (a local run) shows no panel, and a file cut short by its writer is left out
rather than failing the view."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from hrl.cli.main import app
from hrl.runners.live import LiveStatus

HEAD, WORKER = "a" * 12 + "1" * 44, "b" * 12 + "2" * 44  # Ray node ids are 56 hex characters; 12 tell them apart
PLACEMENT = {
    "driver": {"node_id": HEAD, "node_ip": "10.0.0.1"},
    "trainer": "ray",
    "weights": "ship",
    "trainer_ranks": [
        {"rank": 1, "node_id": WORKER, "node_ip": "10.0.0.2", "devices": ["cuda:0"]},
        {"rank": 0, "node_id": HEAD, "node_ip": "10.0.0.1", "devices": ["cuda:1"]},
    ],
    "replicas": [
        {"replica": "r0", "node_id": HEAD, "node_ip": "10.0.0.1", "devices": ["cuda:0"],
         "url": "http://10.0.0.1:40001"},
        {"replica": "r1", "node_id": WORKER, "node_ip": "10.0.0.2", "devices": ["cuda:1", "cuda:2"],
         "url": "http://10.0.0.2:40001"},
    ],
}  # fmt: skip


def top(*args: str) -> tuple[int, str]:
    out = CliRunner().invoke(app, ["top", *args], catch_exceptions=False)
    return out.exit_code, out.stdout


def _run(tmp_path: Path) -> Path:
    """A run directory as a running `hrl train` leaves it: traces/ and the live status its real writer wrote."""
    run = tmp_path / "run"
    (run / "traces").mkdir(parents=True)
    LiveStatus(run, version=lambda: 2).write("running")
    return run


def test_top_shows_the_node_of_every_rank_and_replica(tmp_path):
    run = _run(tmp_path)
    (run / "placement.json").write_text(json.dumps(PLACEMENT))
    code, out = top(str(run), "--once", "--json")
    assert code == 0 and json.loads(out)["placement"] == PLACEMENT  # as the run wrote it, for scripts
    code, human = top(str(run), "--once")
    assert code == 0 and "placement: 2 trainer ranks, 2 replicas on 2 nodes (trainer ray, weights ship)" in human, human
    cells = [[c.strip() for c in line.split("│")[1:5]] for line in human.splitlines() if line.count("│") == 5]
    rows = {c[0]: c[1:] for c in cells if c[0].startswith(("driver", "rank", "replica"))}
    assert rows == {
        "driver": ["a" * 12, "10.0.0.1", "-"],
        "rank 0": ["a" * 12, "10.0.0.1", "cuda:1"],
        "rank 1": ["b" * 12, "10.0.0.2", "cuda:0"],
        "replica r0": ["a" * 12, "10.0.0.1", "cuda:0"],
        "replica r1": ["b" * 12, "10.0.0.2", "cuda:1,cuda:2"],
    }, human
    assert HEAD[:13] not in human  # the ids are cut to 12 characters
    lines = human.splitlines()
    assert lines.index(next(x for x in lines if "rank 0" in x)) < lines.index(next(x for x in lines if "rank 1" in x))


def test_a_run_without_placement_json_shows_no_panel(tmp_path):
    run = _run(tmp_path)
    code, out = top(str(run), "--once", "--json")
    assert code == 0 and json.loads(out)["placement"] is None
    code, human = top(str(run), "--once")
    assert code == 0 and "placement:" not in human and "episodes in flight" in human, human


def test_a_placement_json_cut_short_is_left_out(tmp_path):
    run = _run(tmp_path)
    (run / "placement.json").write_text(json.dumps(PLACEMENT)[:50])  # its writer mid-write
    code, out = top(str(run), "--once", "--json")
    assert code == 0 and json.loads(out)["placement"] is None
    code, human = top(str(run), "--once")
    assert code == 0 and "placement:" not in human and "episodes in flight" in human, human
