"""The error policy, over every `hrl` command: each bad input prints exactly one `Error:` line and one `Hint:` line
on stderr, no traceback, and exits with the policy's code (2 usage, 1 data or run failure, 4 a missing
prerequisite). Every `hrl …` command a hint names, and every option it names, is run with --help and must parse.

The table is checked against the command tree itself: a command with no row fails `test_every_command_has_a_row`.
The rows run the real entry point (`hrl.cli.main.run`, whose code `main` exits with) in this process; none of
them may start any work, which is the point: names and paths are checked first. With HRL_POLICY_TABLE=FILE each row appends itself to FILE as
a markdown table row (input | command | exit | error | hint).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import typer

import hrl.recipes
from hrl.cli.main import app, run
from tests.harbor_tasks import write_task

USAGE, FAILURE, PREREQ = 2, 1, 4


@dataclass(frozen=True)
class Case:
    what: str  # the bad-input class
    argv: tuple[str, ...]  # after `hrl`; {tmp} is a scratch folder with the files made by `_files`
    code: int
    needle: str  # in the Error: line
    env: dict[str, str] = field(default_factory=dict)


CASES = [
    # unknown names
    Case("unknown agent", ("rollout", "--agent", "claude", "--recipe", "demo"), USAGE, "did you mean 'claude-code'"),
    Case("unknown agent", ("train", "--recipe", "demo", "--agent", "nope"), USAGE, "unknown agent 'nope'"),
    Case("unknown agent", ("agents", "install", "nope"), USAGE, "unknown agent 'nope'"),
    Case("unknown agent", ("agents", "doctor", "nope"), USAGE, "unknown agent 'nope'"),
    Case("no image tool", ("agents", "doctor", "aider", "--images"), USAGE, "no tool known to send the model an image"),
    Case(
        "image probe outside docker", ("agents", "doctor", "--images", "--sandbox", "local"), USAGE, "Docker sandboxes"
    ),
    Case(
        "not a vision model",
        ("agents", "doctor", "--images", "--model", "{tmp}/text-model"),
        USAGE,
        "is not a vision model",
    ),
    Case(
        "bad python agent",
        ("rollout", "--agent", "python:no_such_mod:run", "--recipe", "demo"),
        USAGE,
        "cannot load 'python:no_such_mod:run'",
    ),
    Case(
        "bad python agent",
        ("train", "--recipe", "agents-sdk", "--agent", "agent.py:nope"),
        USAGE,
        "has no function 'nope'",
    ),
    Case("unknown agent", ("eval", "--agents", "mini-swe-agent,claude", "--recipe", "demo"), USAGE, "'claude-code'"),
    Case("agent named twice", ("eval", "--agents", "codex,codex", "--recipe", "demo"), USAGE, "twice"),
    Case("unknown recipe", ("rollout", "--agent", "codex", "--recipe", "nope"), USAGE, "no recipe 'nope'"),
    Case("unknown recipe", ("train", "--recipe", "nope"), USAGE, "no recipe 'nope'"),
    Case("unknown recipe", ("recipes", "show", "nope"), USAGE, "no recipe 'nope'"),
    Case("unknown engine", ("rollout", "-a", "codex", "--recipe", "demo", "--engine", "vlm"), USAGE, "'vllm'"),
    Case("unknown engine", ("train", "--recipe", "demo", "--engine", "nope"), USAGE, "unknown engine 'nope'"),
    Case("unknown engine", ("serve", "--model", "hrl:tiny", "--engine", "nope"), USAGE, "unknown engine 'nope'"),
    Case("unknown engine", ("doctor", "--model", "hrl:tiny", "--engine", "nope"), USAGE, "unknown engine 'nope'"),
    Case(
        "unknown tool parser",
        ("serve", "--model", "hrl:tiny", "--tool-parser", "qwen3_coder"),
        USAGE,
        "did you mean 'qwen3-coder'",
    ),
    Case(
        "dishonest sampling",
        ("train", "--recipe", "demo", "-c", "proxy.sampling=agent"),
        USAGE,
        "proxy.sampling=agent cannot be trained on",
    ),
    Case("unknown sampling", ("serve", "--model", "hrl:tiny", "--sampling", "raw"), USAGE, "unknown --sampling 'raw'"),
    Case(
        "unknown reasoning parser",
        ("serve", "--model", "hrl:tiny", "--reasoning-parser", "think_open"),
        USAGE,
        "did you mean 'think-open'",
    ),
    Case(
        "unknown tool parser",
        ("doctor", "--model", "hrl:tiny", "--tool-parser", "harmony"),
        USAGE,
        "unknown tool parser 'harmony'",
    ),
    Case("unknown sandbox", ("rollout", "-a", "codex", "--recipe", "demo", "--sandbox", "dock"), USAGE, "'docker'"),
    Case("unknown sandbox", ("train", "--recipe", "demo", "--sandbox", "nope"), USAGE, "unknown sandbox 'nope'"),
    Case("unknown sandbox", ("tasks", "validate", "{tmp}/tasks.jsonl", "--sandbox", "nope"), USAGE, "sandbox 'nope'"),
    Case(
        "unknown sandbox",
        ("tasks", "synth", "--package", "x", "--out", "{tmp}/o.jsonl", "--sandbox", "no"),
        USAGE,
        "unknown sandbox 'no'",
    ),
    Case("unknown sandbox", ("agents", "install", "codex", "--target", "nope"), USAGE, "unknown sandbox 'nope'"),
    Case("unknown sandbox", ("agents", "doctor", "--sandbox", "nope"), USAGE, "unknown sandbox 'nope'"),
    Case("unknown hrl model", ("serve", "--model", "hrl:huge"), USAGE, "unknown hrl model 'hrl:huge'"),
    Case("unknown trace id", ("inspect", "{tmp}/traces.jsonl", "--trace", "zz"), USAGE, "no trace with id 'zz'"),
    # bad paths
    Case(
        "missing task file",
        ("rollout", "-a", "codex", "--recipe", "demo", "--tasks", "{tmp}/no.jsonl"),
        USAGE,
        "no.jsonl does not exist",
    ),
    Case("missing task file", ("tasks", "ls", "{tmp}/no.jsonl"), USAGE, "no.jsonl does not exist"),
    Case("missing task file", ("tasks", "validate", "{tmp}/no.jsonl"), USAGE, "no.jsonl does not exist"),
    Case("missing task file", ("tasks", "check", "{tmp}/no.jsonl"), USAGE, "no.jsonl does not exist"),
    Case("unknown sandbox", ("tasks", "check", "{tmp}/tasks.jsonl", "--sandbox", "nope"), USAGE, "sandbox 'nope'"),
    Case("bounded flag", ("tasks", "check", "{tmp}/tasks.jsonl", "--runs", "0"), USAGE, "'--runs'"),
    Case(
        "missing sdist",
        ("tasks", "synth", "--package", "x", "--out", "{tmp}/o.jsonl", "--sdist", "{tmp}/x.tgz"),
        USAGE,
        "sdist not found",
    ),
    Case("--out a folder", ("rollout", "-a", "codex", "--recipe", "demo", "--out", "{tmp}/empty"), USAGE, "directory"),
    Case(
        "--out under a file",
        ("rollout", "-a", "codex", "--recipe", "demo", "--out", "{tmp}/tasks.jsonl/t.jsonl"),
        USAGE,
        "tasks.jsonl/t.jsonl: ",
    ),
    Case(
        "--out under a file",
        ("report", "{tmp}/traces.jsonl", "--out", "{tmp}/tasks.jsonl/r.html"),
        USAGE,
        "tasks.jsonl is a file, not a folder",
    ),
    Case(
        "--out under a file",
        ("tasks", "synth", "--package", "x", "--out", "{tmp}/tasks.jsonl/o.jsonl", "--sandbox", "local"),
        USAGE,
        "tasks.jsonl is a file, not a folder",
    ),
    Case("--out a folder", ("tasks", "synth", "--package", "x", "--out", "{tmp}/empty"), USAGE, "is a directory"),
    Case("empty trace file", ("report", "{tmp}/empty.jsonl"), USAGE, "empty.jsonl holds no trace"),
    Case("empty trace file", ("regrade", "{tmp}/empty.jsonl"), USAGE, "empty.jsonl holds no trace"),
    Case("missing model", ("serve", "--model", "{tmp}/no-model"), USAGE, "model not found"),
    Case(
        "missing model",
        ("rollout", "-a", "codex", "--recipe", "demo", "--model", "{tmp}/no-model"),
        USAGE,
        "model not found",
    ),
    Case("missing model", ("agents", "doctor", "--model", "{tmp}/no-model"), USAGE, "model not found"),
    Case("missing trace file", ("inspect", "{tmp}/no.jsonl"), USAGE, "no such file or directory"),
    Case("missing trace file", ("report", "{tmp}/no.jsonl"), USAGE, "no such file or directory"),
    Case("folder with no traces", ("report", "{tmp}/empty"), USAGE, "neither a run directory nor"),
    Case("missing trace file", ("regrade", "{tmp}/no.jsonl"), USAGE, "no run directory or trace file"),
    Case("folder with no traces", ("regrade", "{tmp}/empty"), USAGE, "is not a run directory"),
    Case("run with no traces", ("regrade", "{tmp}/run"), USAGE, "holds no trace files"),
    Case("missing trace file", ("export", "{tmp}/no.jsonl"), USAGE, "no such file or directory"),
    Case("unknown format", ("export", "{tmp}/traces.jsonl", "--format", "xml"), USAGE, "unknown --format 'xml'"),
    Case("--out is a file", ("export", "{tmp}/traces.jsonl", "--out", "{tmp}/tasks.jsonl"), USAGE, "not a folder"),
    Case("missing run dir", ("top", "{tmp}/no-run"), USAGE, "run directory not found"),
    Case("folder that is not a run", ("top", "{tmp}/empty"), USAGE, "is not a run directory"),
    Case("--json without --once", ("top", "{tmp}/run", "--json"), USAGE, "it needs --once"),
    Case("bounded flag", ("top", "{tmp}/run", "--interval", "0"), USAGE, "'--interval'"),
    Case("live view without a terminal", ("top", "{tmp}/run"), USAGE, "needs a terminal"),
    Case("nothing to regrade", ("regrade", "{tmp}/traces.jsonl"), FAILURE, "can be regraded (1 not regradable"),
    Case("--resume without a run", ("train", "--run-dir", "{tmp}/empty", "--resume"), USAGE, "existing run"),
    Case(
        "new run in an old run dir",
        ("train", "--recipe", "demo", "--run-dir", "{tmp}/run"),
        USAGE,
        "holds a run already",
    ),
    Case(  # stopped before its first step: a config.json, no state.json
        "new run in a run dir of another recipe",
        ("train", "--recipe", "langgraph-react", "--run-dir", "{tmp}/started"),
        USAGE,
        "started holds a run already (recipe demo)",
    ),
    Case("--resume of an eval run", ("train", "--run-dir", "{tmp}/evaluated", "--resume"), USAGE, "`hrl eval` run"),
    # bad -c keys and values
    Case(
        "unknown -c key",
        ("rollout", "-a", "codex", "--recipe", "demo", "-c", "train.iteratons=3"),
        USAGE,
        "did you mean 'train.iterations'",
    ),
    Case("unknown -c key", ("train", "--recipe", "demo", "-c", "trainer.lrr=1e-5"), USAGE, "'trainer.lr'"),
    Case(
        "unknown -c key",
        ("train", "--recipe", "demo", "-c", "engine_options.max_btch=2"),
        USAGE,
        "'engine_options.max_batch_size'",
    ),
    Case("bad -c value", ("train", "--recipe", "demo", "-c", "train.iterations=many"), USAGE, "valid integer"),
    Case(
        "bad -c value",
        ("rollout", "-a", "codex", "--recipe", "demo", "-c", "proxy.version_policy=x"),
        USAGE,
        "'mixed' or 'pin'",
    ),
    Case("bad -c form", ("train", "--recipe", "demo", "-c", "{tmp}/none.yaml"), USAGE, "expected key=value"),
    # values past a field's or a flag's bound, and recipe files checked as -c is
    Case("bounded -c value", ("train", "--recipe", "demo", "-c", "train.group_size=0"), USAGE, "train.group_size=0"),
    Case("bounded -c value", ("train", "--recipe", "demo", "-c", "trainer.lr=-1"), USAGE, "trainer.lr=-1"),
    Case("non-finite -c value", ("train", "--recipe", "demo", "-c", "trainer.lr=inf"), USAGE, "a finite number"),
    Case("non-finite -c value", ("train", "--recipe", "demo", "-c", "trainer.lr=nan"), USAGE, "trainer.lr='nan'"),
    Case("non-finite -c value", ("train", "--recipe", "demo", "-c", "trainer.lr=-inf"), USAGE, "trainer.lr='-inf'"),
    Case(
        "non-finite -c value",
        ("rollout", "-a", "codex", "--recipe", "demo", "-c", "rollout.time_budget_s=.inf"),
        USAGE,
        "rollout.time_budget_s=inf: Input should be a finite number",
    ),
    Case(
        "bounded -c value",
        ("eval", "-a", "codex", "--recipe", "demo", "-c", "train.eval_episodes=0"),
        USAGE,
        "train.eval_episodes=0",
    ),
    Case("bounded flag", ("train", "--recipe", "demo", "--iterations", "-1"), USAGE, "'--iterations'"),
    Case(
        "fields that disagree",
        ("train", "--recipe", "demo", "-c", "train.task_sampler=balanced"),
        USAGE,
        "set train.sampler_key",
    ),
    Case("bounded flag", ("rollout", "-a", "codex", "--recipe", "demo", "--limit", "-1"), USAGE, "'--limit'"),
    Case("bounded flag", ("rollout", "-a", "codex", "--recipe", "demo", "-n", "0"), USAGE, "'-n'"),
    Case("bounded flag", ("serve", "--model", "hrl:tiny", "--port", "99999"), USAGE, "'--port'"),
    Case("bounded flag", ("tasks", "validate", "{tmp}/tasks.jsonl", "--concurrency", "0"), USAGE, "'--concurrency'"),
    Case("misspelt recipe key", ("train", "--recipe", "{tmp}/typo-top"), USAGE, "did you mean 'trainer' or 'train'"),
    Case(
        "misspelt recipe key",
        ("rollout", "-a", "codex", "--recipe", "{tmp}/typo-nested"),
        USAGE,
        "did you mean 'train.group_size'",
    ),
    # flags that cannot change on --resume
    Case(
        "--resume with --model",
        ("train", "--run-dir", "{tmp}/run", "--resume", "--model", "m"),
        USAGE,
        "--model cannot change on --resume",
    ),
    Case(
        "--resume with --recipe",
        ("train", "--run-dir", "{tmp}/run", "--resume", "--recipe", "swe"),
        USAGE,
        "--recipe cannot change on --resume",
    ),
    # missing arguments and bad flags
    Case("no tasks", ("rollout", "--agent", "codex"), USAGE, "give --recipe or --tasks"),
    Case("no tasks", ("eval", "--agents", "codex"), USAGE, "give --recipe or --tasks"),
    Case(
        "--run-dir not empty",
        ("eval", "--agents", "codex", "--recipe", "demo", "--run-dir", "{tmp}/run"),
        USAGE,
        "is not empty",
    ),
    Case(
        "--run-dir a file",
        ("eval", "--agents", "codex", "--recipe", "demo", "--run-dir", "{tmp}/tasks.jsonl"),
        USAGE,
        "is a file",
    ),
    Case(
        "Harbor tasks outside docker",
        ("rollout", "-a", "codex", "--tasks", "{tmp}/harbor", "--model", "m", "--sandbox", "local"),
        USAGE,
        "Harbor tasks run in Docker sandboxes",
    ),
    Case("a folder with no Harbor task", ("tasks", "ls", "{tmp}/empty"), FAILURE, "holds no Harbor task"),
    Case("no recipe", ("train",), USAGE, "give --recipe"),
    Case("missing argument", ("models", "tiny"), USAGE, "Missing argument"),
    Case("unknown family", ("models", "tiny", "{tmp}/m", "--family", "gpt-os"), USAGE, "did you mean 'gpt-oss'"),
    Case("bad option value", ("models", "tiny-agent", "{tmp}/m", "--right-op", "lots"), USAGE, "'--right-op'"),
    Case(
        "verify a build never shipped",
        ("models", "tiny-agent", "{tmp}/m", "--seed", "7", "--verify"),
        USAGE,
        "the default config's only",
    ),
    Case("unknown pretrained model", ("models", "get", "gpt-5"), USAGE, "unknown pretrained model 'gpt-5'"),
    Case("bad option value", ("models", "get", "smollm2-135m", "{tmp}/m", "--dtype", "int4"), USAGE, "dtype 'int4'"),
    Case("a folder of other files", ("models", "get", "smollm2-135m", "{tmp}"), USAGE, "holds no build"),
    Case("unknown flag", ("models", "ls", "--long"), USAGE, "No such option: --long"),
    Case("missing argument", ("tasks", "ls"), USAGE, "Missing argument"),
    Case("missing option", ("tasks", "synth", "--out", "o.jsonl"), USAGE, "--package"),
    Case("no prune target", ("sandbox", "prune"), USAGE, "give --run RUN_ID or --all"),
    Case("no keys target", ("keys", "add", "fleet"), USAGE, "give --run-dir or --keys-file"),
    Case("bad key name", ("keys", "add", "a b", "--keys-file", "{tmp}/k.json"), USAGE, "client key name 'a b'"),
    Case("missing keys file", ("keys", "ls", "--run-dir", "{tmp}/no-run"), USAGE, "no client keys yet"),
    Case("unknown flag", ("recipes", "ls", "--long"), USAGE, "No such option: --long"),
    Case("unknown flag", ("agents", "ls", "--all"), USAGE, "No such option: --all"),
    Case("unknown flag", ("doctor", "--fix"), USAGE, "No such option: --fix"),
    Case("unknown command", ("deploy",), USAGE, "No such command 'deploy'"),
    # data failures: the input exists but is wrong
    Case("malformed JSONL", ("tasks", "ls", "{tmp}/bad.jsonl"), FAILURE, "bad.jsonl:1: not JSON"),
    Case(
        "malformed JSONL",
        ("rollout", "-a", "codex", "--recipe", "demo", "--tasks", "{tmp}/bad.jsonl"),
        FAILURE,
        "bad.jsonl:1: not JSON",
    ),
    Case("task missing a field", ("tasks", "ls", "{tmp}/nofield.jsonl"), FAILURE, "problem_statement"),
    Case("task missing a field", ("tasks", "validate", "{tmp}/nofield.jsonl"), FAILURE, "problem_statement"),
    Case("non-trace file", ("inspect", "{tmp}/tasks.jsonl"), FAILURE, "not a valid hrl.trace/1 trace"),
    Case("non-trace file", ("report", "{tmp}/tasks.jsonl"), FAILURE, "not a valid hrl.trace/1 trace"),
    Case("non-trace file", ("export", "{tmp}/tasks.jsonl"), FAILURE, "not a valid hrl.trace/1 trace"),
    Case("binary file", ("inspect", "{tmp}/binary.jsonl"), FAILURE, "binary.jsonl:1: not a valid hrl.trace/1 trace"),
    Case("binary file", ("report", "{tmp}/binary.jsonl"), FAILURE, "binary.jsonl:1: not a valid hrl.trace/1 trace"),
    Case("empty repo_snapshot", ("tasks", "ls", "{tmp}/nosnap.jsonl"), FAILURE, "repo_snapshot: is an empty string"),
    Case(
        "empty repo_snapshot",
        ("rollout", "-a", "codex", "--recipe", "demo", "--tasks", "{tmp}/nosnap.jsonl"),
        FAILURE,
        "task 't1' is not valid: repo_snapshot",
    ),
    Case("port in use", ("serve", "--model", "hrl:tiny", "--port", "{port}"), FAILURE, "port"),
    # missing prerequisites
    Case(
        "no vLLM",
        ("serve", "--model", "hrl:tiny", "--engine", "vllm"),
        PREREQ,
        "needs a Python with vLLM",
        {"HRL_VLLM_PYTHON": "/nonexistent/python"},
    ),
    Case(
        "no vLLM",
        ("rollout", "-a", "codex", "--recipe", "demo", "--engine", "vllm"),
        PREREQ,
        "vLLM",
        {"HRL_VLLM_PYTHON": "/nonexistent/python"},
    ),
    Case(
        "no docker daemon",
        ("rollout", "-a", "codex", "--recipe", "swe"),
        PREREQ,
        "cannot reach the Docker daemon",
        {"DOCKER_HOST": "unix:///nonexistent"},
    ),
    Case("no docker daemon", ("sandbox", "ls"), PREREQ, "no Docker daemon", {"DOCKER_HOST": "unix:///nonexistent"}),
    Case("no docker daemon", ("sandbox", "build"), PREREQ, "no Docker daemon", {"DOCKER_HOST": "unix:///nonexistent"}),
]

TASK = {"instance_id": "t1", "problem_statement": "fix it", "FAIL_TO_PASS": ["test_a.py::test_a"]}
TRACE = {
    "schema": "hrl.trace/1", "trace_id": "a1b2c3d4", "session": "s", "task_id": "t1", "status": "ok",
    "failure_reason": None, "reward": 1.0, "calls": [], "started_at": 0.0, "ended_at": 1.0,
}  # fmt: skip


def _files(tmp: Path) -> None:
    (tmp / "tasks.jsonl").write_text(json.dumps(TASK) + "\n")
    (tmp / "bad.jsonl").write_text("{not json\n")
    (tmp / "nofield.jsonl").write_text(json.dumps({"instance_id": "t2"}) + "\n")
    (tmp / "traces.jsonl").write_text(json.dumps(TRACE) + "\n")
    (tmp / "empty.jsonl").write_text("")
    (tmp / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (tmp / "nosnap.jsonl").write_text(json.dumps({**TASK, "repo_snapshot": ""}) + "\n")
    (tmp / "empty").mkdir()
    (tmp / "text-model").mkdir()
    (tmp / "text-model" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_task(tmp / "harbor", "reward-file")
    (tmp / "run").mkdir()
    demo = (Path(hrl.recipes.__path__[0]) / "demo" / "recipe.yaml").read_text()
    for name, text in (("typo-top", demo.replace("\ntrain:", "\ntrainr:")),
                       ("typo-nested", demo.replace("  group_size: 8", "  group_sise: 8"))):  # fmt: skip
        (tmp / name).mkdir()
        (tmp / name / "recipe.yaml").write_text(text)
    (tmp / "run" / "config.json").write_text(json.dumps({"recipe": "demo", "model": "m", "tasks": "t"}))
    (tmp / "run" / "state.json").write_text(json.dumps({"iteration": 1, "version": 1, "checkpoint": None}))
    for name in ("started", "evaluated"):  # a train run stopped before its first step; an `hrl eval` run
        (tmp / name).mkdir()
        (tmp / name / "config.json").write_text(json.dumps({"recipe": "demo", "model": "m", "tasks": "t"}))
    (tmp / "evaluated" / "eval.json").write_text("{}")


def run_hrl(argv: list[str], env: dict[str, str], monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str, str]:
    """`hrl ARGV` through the console entry point; (exit code, stdout, stderr)."""
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as m:
        m.setattr(sys, "argv", ["hrl", *argv])
        m.delenv("HRL_DEBUG", raising=False)  # a traceback only where a row asks for one
        for k, v in {"NO_COLOR": "1", **env}.items():
            m.setenv(k, v)
        try:
            code = run()
        finally:
            signal.signal(signal.SIGINT, handlers[0])
            signal.signal(signal.SIGTERM, handlers[1])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---- the command tree ------------------------------------------------------------------------------------------


def _tree() -> Any:
    return typer.main.get_command(app)


def _is_group(cmd: Any) -> bool:
    """A group, by its shape: typer >= 0.26 builds commands from its own copy of click, not `click.Group`."""
    return isinstance(getattr(cmd, "commands", None), dict)


def commands() -> dict[tuple[str, ...], Any]:
    """Every visible command by its path under `hrl` (groups' hidden `list` aliases left out)."""
    found: dict[tuple[str, ...], Any] = {}

    def walk(cmd: Any, path: tuple[str, ...]) -> None:
        if _is_group(cmd):
            for name, sub in cmd.commands.items():
                if not sub.hidden:
                    walk(sub, (*path, name))
        else:
            found[path] = cmd

    walk(_tree(), ())
    return found


def _command_of(tokens: list[str]) -> tuple[tuple[str, ...], Any, list[str]]:
    """The command a token list names (its path, the command, the tokens after the path)."""
    cmd: Any = _tree()
    path: list[str] = []
    while _is_group(cmd) and tokens and tokens[0] in cmd.commands:
        cmd = cmd.commands[tokens[0]]
        path.append(tokens.pop(0))
    return tuple(path), cmd, tokens


def _options(cmd: Any) -> set[str]:
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}


def _named_options(text: str) -> set[str]:
    return {m.split("=")[0] for m in re.findall(r"(?<![\w`/-])(--?[a-zA-Z][\w-]*(?:=\S*)?)", text)}


# ---- the tests ---------------------------------------------------------------------------------------------------


def test_every_command_has_a_row():
    covered = {_command_of(list(c.argv))[0] for c in CASES}
    missing = sorted(" ".join(p) for p in commands() if p not in covered)
    assert not missing, f"commands without a row in the error-policy table: {missing}"


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.what}: hrl {' '.join(c.argv)}" for c in CASES])
def test_error_policy(case: Case, tmp_path: Path, busy_port: int, monkeypatch, capsys):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = [a.format(tmp=tmp_path, port=busy_port) for a in case.argv]
    code, _out, err = run_hrl(argv, case.env, monkeypatch, capsys)
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    hints = [line for line in err.splitlines() if line.startswith("Hint: ")]
    assert (len(errors), len(hints)) == (1, 1), err
    assert code == case.code, err
    assert case.needle in errors[0], err
    _check_hint(hints[0].removeprefix("Hint: "), argv, monkeypatch, capsys)
    if table := os.environ.get("HRL_POLICY_TABLE"):
        cells = [case.what, f"`hrl {' '.join(case.argv)}`", str(code), errors[0][7:], hints[0][6:]]
        with Path(table).open("a") as f:
            f.write("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |\n")


def _check_hint(hint: str, argv: list[str], monkeypatch, capsys) -> None:
    """Each `hrl …` the hint names parses with --help and has the options it names; a bare option in the hint is
    one of the failing command's, or of a command the hint names."""
    named = [shlex.split(m)[1:] for m in re.findall(r"`(hrl(?: [^`]*)?)`", hint)]
    own = _options(_command_of(list(argv))[1])
    known = set(own)
    for tokens in named:
        path, cmd, rest = _command_of(list(tokens))
        code, _out, err = run_hrl([*path, "--help"], {}, monkeypatch, capsys)
        assert code == 0, f"hint names `hrl {' '.join(tokens)}`, whose --help fails: {err}"
        assert not ({t.split("=")[0] for t in rest if t.startswith("-")} - _options(cmd)), (hint, _options(cmd))
        known |= _options(cmd)
    bare = _named_options(re.sub(r"`[^`]*`", "", hint))
    assert bare <= known, f"hint {hint!r} names options {sorted(bare - known)} that no command it names has"


def test_a_refused_config_starts_nothing(tmp_path: Path, monkeypatch, capsys):
    """A bounded value, a non-finite one (inf, -inf, nan), a bounded flag, fields that disagree and a misspelt recipe
    key are refused before the run directory is made."""
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    for argv in (["train", "--recipe", "demo", "-c", "train.group_size=0"],
                 ["train", "--recipe", "demo", "-c", "train.task_sampler=balanced"], ["train", "--recipe", "demo",
                 "--iterations", "-1"], ["train", "--recipe", str(tmp_path / "typo-nested"), "--run-dir", "r"],
                 *(["train", "--recipe", "demo", "-c", f"trainer.lr={v}", "--run-dir", "r"] for v in ("inf", "-inf",
                 "nan"))):  # fmt: skip
        code, _out, err = run_hrl(argv, {}, monkeypatch, capsys)
        assert code == USAGE, err
        assert not (tmp_path / "runs").exists() and not (tmp_path / "r").exists(), argv


def test_a_traceback_only_with_hrl_debug(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["rollout", "--agent", "nope", "--recipe", "demo"]
    assert "Traceback" not in run_hrl(argv, {}, monkeypatch, capsys)[2]
    code, _, err = run_hrl(argv, {"HRL_DEBUG": "1"}, monkeypatch, capsys)
    assert code == USAGE and "Traceback (most recent call last)" in err and "Error: unknown agent 'nope'" in err
