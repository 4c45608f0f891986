"""The CPU demo's tasks: generated one-bug repositories.

A repository holds one module with one function whose operator was swapped for its mirror (`+`/`-`,
`==`/`!=`, `and`/`or`, `min`/`max`); hidden pytest tests check it. The fix is one `sed`
substitution back to the mirror. The problem statement names the module and lists the failing tests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hrl.runners.tasks.patches import file_diff
from hrl.runners.tasks.task import Task

__all__ = ["Bug", "bug_task", "demo_tasks", "signature", "split_tasks", "task_bug", "write_demo_tasks", "wrong_ops"]

MIRROR = {"+": "-", "-": "+", "==": "!=", "!=": "==", "and": "or", "or": "and", "min": "max", "max": "min"}
# Plausible replacements of the same kind (the SFT noise picks the wrong ones among these).
KINDS = [
    ["+", "-", "*", "%"],
    ["==", "!=", "<", ">", "<=", ">="],
    ["and", "or", "==", "!="],
    ["min", "max", "pow", "round"],
]
# (correct op, function names, body, argument kind). Operators whose code the harness shows verbatim: mini-swe-agent
# renders tool output with jinja's tojson, which escapes < and > (a 7-token `\u003c=` a tiny model cannot copy).
_FAMILIES: list[tuple[str, list[str], str, str]] = [
    ("+", ["add", "plus", "total", "combine", "sum_two", "join_counts", "grow", "extend_by"], "{a} + {b}", "int"),
    (
        "-",
        ["subtract", "minus", "difference", "take_away", "remaining", "gap", "shrink", "reduce_by"],
        "{a} - {b}",
        "int",
    ),
    ("+", ["next_index", "successor", "one_more", "bump", "following", "advance"], "{a} + 1", "int1"),
    ("-", ["prev_index", "predecessor", "one_less", "step_back", "preceding", "retreat"], "{a} - 1", "int1"),
    ("==", ["same", "is_equal", "matches", "equal_values", "agrees", "identical"], "{a} == {b}", "int"),
    ("!=", ["differs", "is_different", "changed", "not_equal", "disagrees", "distinct"], "{a} != {b}", "int"),
    ("and", ["both", "all_true", "and_gate", "both_set", "all_ready", "joint"], "{a} and {b}", "bool"),
    ("or", ["either", "any_true", "or_gate", "one_set", "any_ready", "some"], "{a} or {b}", "bool"),
    ("min", ["smaller", "lowest", "minimum", "floor_of", "least", "cheapest"], "min({a}, {b})", "int"),
    ("max", ["larger", "highest", "maximum", "ceiling_of", "most", "priciest"], "max({a}, {b})", "int"),
]
_MODULES = ["calc", "mathx", "util", "helpers", "logic", "checks", "rules", "metrics", "score", "grid", "timer",
            "budget", "ledger", "rating", "ranking", "limits", "counter", "tally", "gauge", "meter", "inventory",
            "orders", "prices", "points", "levels", "ages", "sizes", "weights", "steps", "votes"]  # fmt: skip
_PARAMS = [("a", "b"), ("x", "y"), ("left", "right"), ("first", "second"), ("m", "n"), ("p", "q"), ("lo", "hi")]
_UNARY = ["n", "i", "k", "x", "index", "count", "pos"]


@dataclass(frozen=True)
class Bug:
    module: str
    function: str
    params: tuple[str, ...]
    body: str  # correct expression, e.g. "a + b"
    op: str  # correct operator
    bug: str  # the operator in the code (its mirror)
    cases: tuple[tuple[Any, ...], ...]  # argument tuples the tests call the function with

    def expr(self, op: str) -> str:
        """The function's expression with `op` where the correct operator is."""
        return _swap(self.body, self.op, op)

    def source(self, op: str) -> str:
        expr = self.expr(op)
        return f"def {self.function}({', '.join(self.params)}):\n    return {expr}\n"

    def sed(self, op: str, in_place: bool = True) -> str:
        """The one-line fix that puts `op` where the buggy operator is."""
        old, new = (f" {self.bug}(", f" {op}(") if self.bug in ("min", "max") else (f" {self.bug} ", f" {op} ")
        return f"sed {'-i ' if in_place else ''}'s/{old}/{new}/' *.py"


def _swap(body: str, old: str, new: str) -> str:
    return body.replace(f"{old}(", f"{new}(") if old in ("min", "max") else body.replace(f" {old} ", f" {new} ")


def _call(bug: Bug, op: str, args: tuple[Any, ...]) -> Any:
    scope: dict[str, Any] = {}
    try:
        exec(bug.source(op), scope)  # generated two-line functions over ints and bools
        return scope[bug.function](*args)
    except Exception as e:  # a wrong operator may raise (TypeError, ZeroDivisionError): that is its outcome
        return type(e).__name__


def _cases(rng: random.Random, kind: str) -> list[tuple[Any, ...]]:
    if kind == "bool":
        return [(True, True), (True, False), (False, True), (False, False)]
    if kind == "int1":
        return [(rng.randint(0, 9),) for _ in range(3)]
    a, b = rng.sample(range(1, 10), 2)
    return [(a, b), (b, a), (a, a), (rng.randint(0, 9), rng.randint(1, 9))]


def _make_bug(rng: random.Random) -> Bug | None:
    op, names, body, kind = rng.choice(_FAMILIES)
    params = (rng.choice(_UNARY),) if kind == "int1" else rng.choice(_PARAMS)
    expr = body.format(a=params[0], b=params[-1])
    bug = Bug(rng.choice(_MODULES), rng.choice(names), params, expr, op, MIRROR[op], tuple(_cases(rng, kind)))
    right = [_call(bug, op, c) for c in bug.cases]
    if all(_call(bug, bug.bug, c) == r for c, r in zip(bug.cases, right, strict=True)):
        return None  # the tests would not see the bug
    return bug


def wrong_ops(bug: Bug) -> list[str]:
    """Plausible replacements that the tests reject (the buggy operator itself first: a fix that changes nothing)."""
    kind = next(k for k in KINDS if bug.bug in k and bug.op in k)
    right = [_call(bug, bug.op, c) for c in bug.cases]
    out = [o for o in kind if o != bug.op and [_call(bug, o, c) for c in bug.cases] != right]
    return sorted(out, key=lambda o: o != bug.bug)


def _test_name(bug: Bug, k: int) -> str:
    return f"tests/test_{bug.module}.py::test_{bug.function}_{k}"


def _test_file(bug: Bug) -> str:
    lines = [f"from {bug.module} import {bug.function}\n"]
    for k, case in enumerate(bug.cases):
        expected = _call(bug, bug.op, case)
        lines.append(f"\n\ndef test_{bug.function}_{k}():\n    assert {bug.function}{case!r} == {expected!r}\n")
    return "".join(lines).replace(",)", ")")


def bug_task(bug: Bug, instance_id: str) -> Task:
    """A SWE-format task for a bug: the buggy module as the snapshot, the tests as the hidden test patch."""
    path, test_path = f"{bug.module}.py", f"tests/test_{bug.module}.py"
    failing, passing, lines = [], [], []
    for k, case in enumerate(bug.cases):
        got, want = _call(bug, bug.bug, case), _call(bug, bug.op, case)
        (failing if got != want else passing).append(_test_name(bug, k))
        if got != want:
            call = f"{bug.function}{case!r}".replace(",)", ")")
            # no operator tokens (==, a bare minus) here: the only operator in sight should be the code's
            lines.append(f"FAILED {_test_name(bug, k)} - {call} returned [{got}], expected [{want}]")
    statement = f"Fix the bug in {path}. These tests fail:\n" + "\n".join(lines[:2])
    return Task(
        instance_id=instance_id,
        repo="hrl/demo",
        repo_snapshot={path: bug.source(bug.bug)},
        problem_statement=statement,
        FAIL_TO_PASS=failing,
        PASS_TO_PASS=passing,
        test_patch=file_diff(test_path, None, _test_file(bug)),
        patch=file_diff(path, bug.source(bug.bug), bug.source(bug.op)),
        test_timeout_s=60,
        demo={"module": bug.module, "function": bug.function, "params": list(bug.params), "body": bug.body,
              "op": bug.op, "bug": bug.bug, "cases": [list(c) for c in bug.cases], "fix": bug.sed(bug.op)},
    )  # fmt: skip


def task_bug(task: Task | dict[str, Any]) -> Bug:
    """The Bug a demo task was made from."""
    d = (task if isinstance(task, dict) else task.model_dump())["demo"]
    return Bug(d["module"], d["function"], tuple(d["params"]), d["body"], d["op"], d["bug"],
               tuple(tuple(c) for c in d["cases"]))  # fmt: skip


def signature(bug: Bug) -> tuple[str, str, str]:
    return (bug.module, bug.function, bug.body)


def demo_tasks(seed: int, n: int, prefix: str, exclude: set[tuple[str, str, str]] | None = None) -> list[Task]:
    """`n` distinct demo tasks from `seed`; `exclude` holds (module, function, body) signatures to skip."""
    rng, seen, out = random.Random(seed), set(exclude or ()), []
    while len(out) < n:
        bug = _make_bug(rng)
        if bug is None or signature(bug) in seen:
            continue
        seen.add(signature(bug))
        out.append(bug_task(bug, f"{prefix}-{len(out):04d}-{bug.module}-{bug.function}"))
    return out


SPLITS = {"heldout": (20_261, 48), "tasks": (20_262, 240)}  # file stem -> (seed, count); held-out first


def split_tasks() -> dict[str, list[Task]]:
    """The recipe's task files: held-out tasks, then training tasks disjoint from them."""
    seen: set[tuple[str, str, str]] = set()
    out = {}
    for stem, (seed, n) in SPLITS.items():
        out[stem] = demo_tasks(seed, n, f"demo-{stem}", seen)
        seen |= {signature(task_bug(t)) for t in out[stem]}
    return out


def write_demo_tasks(recipe_dir: str | Path) -> list[Path]:
    """(Re)write `tasks.jsonl` and `heldout.jsonl` in the recipe folder."""
    from hrl.runners.tasks.task import write_tasks

    return [write_tasks(tasks, Path(recipe_dir) / f"{stem}.jsonl") for stem, tasks in split_tasks().items()]
