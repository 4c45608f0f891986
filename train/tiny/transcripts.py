"""The CPU demo's data: generated one-bug repositories, the harness's prompt profile, and SFT transcripts.

Tasks. A repository holds one module with one function whose operator was swapped for its mirror (`+`/`-`,
`==`/`!=`, `and`/`or`, `min`/`max`); hidden pytest tests check it. The fix is one `sed`
substitution back to the mirror. The problem statement names the module and lists the failing tests.

Harness profile. What mini-swe-agent sends on its first request (system prompt, instance prompt around the task,
the `bash` tool) and how it renders a tool result, captured from the real CLI through the real proxy
(`tiny.agent.capture_profile`) and kept in `recipes/demo/harness.json`, so a build needs no agent install.

Transcripts. `cat *.py`, `sed -i` the fix, submit: the messages mini-swe-agent would send, rendered to token ids
exactly as the proxy builds them (`render_ids` runs the proxy's own `Session` prompt planning), with a loss mask
on the sampled (assistant) tokens only. `Noise` makes the warm-started model's fix often wrong in ways that
sampling + reward can repair: a plausible but wrong operator, or `sed` without `-i`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hrl.runners.proxy.dialects.chat import ChatDialect
from hrl.runners.proxy.session import Session
from hrl.runners.proxy.template import ChatTemplate, parse_hermes
from hrl.runners.tasks.patches import file_diff
from hrl.runners.tasks.task import Task

__all__ = [
    "SUBMIT",
    "HarnessProfile",
    "Noise",
    "bash_turn",
    "demo_tasks",
    "load_profile",
    "render_ids",
    "render_ids_fast",
    "transcript",
    "write_demo_tasks",
]

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
PROFILE_FILE = "harness.json"
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


# ---- tasks ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bug:
    module: str
    function: str
    params: tuple[str, ...]
    body: str  # correct expression, e.g. "a + b"
    op: str  # correct operator
    bug: str  # the operator in the code (its mirror)
    cases: tuple[tuple[Any, ...], ...]  # argument tuples the tests call the function with

    def source(self, op: str) -> str:
        expr = _swap(self.body, self.op, op)
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


# ---- the harness's prompt profile -------------------------------------------------------------------------------


@dataclass(frozen=True)
class HarnessProfile:
    """What the harness sends: `system`; the instance prompt is `before` + task + `after` (the machine's
    `uname` line replaced by `{uname}`); `tools`; tool results are `observation` rendered with jinja2."""

    agent: str
    version: str
    system: str
    before: str
    after: str
    uname: str  # the capture machine's "system release version machine"
    tools: list[dict[str, Any]]
    observation: str  # mini-swe-agent's observation_template

    def user(self, task: str, uname: str | None = None) -> str:
        """The instance prompt for `task`."""
        return self.before + task + self.after.replace("{uname}", uname or machine_uname())

    def tool_result(self, output: str, returncode: int = 0) -> str:
        from jinja2 import StrictUndefined, Template

        out = {"output": output, "returncode": returncode, "exception_info": ""}
        return Template(self.observation, undefined=StrictUndefined).render(output=out)


def machine_uname() -> str:
    """The `{{system}} {{release}} {{version}} {{machine}}` line mini-swe-agent puts into its prompt here."""
    import platform

    u = platform.uname()
    return f"{u.system} {u.release} {u.version} {u.machine}"


def load_profile(path: str | Path | None = None) -> HarnessProfile:
    """The profile shipped with the demo recipe (or one at `path`)."""
    if path is None:
        from importlib.resources import files

        text = (files("hrl.recipes") / "demo" / PROFILE_FILE).read_text()
    else:
        text = Path(path).read_text()
    return HarnessProfile(**json.loads(text))


# ---- transcripts ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noise:
    """How often the warm-start transcripts go wrong. right_op: the fix puts the mirror operator back (else a
    plausible wrong one); in_place: `sed` edits the file (else it only prints it)."""

    right_op: float = 0.5
    in_place: float = 0.2


def bash_turn(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def transcript(bug: Bug, rng: random.Random, noise: Noise) -> list[tuple[dict[str, Any], str]]:
    """The agent's turns and what each one prints: cat, sed, submit (the submit prints nothing back)."""
    wrong = wrong_ops(bug)
    op = bug.op if rng.random() < noise.right_op or not wrong else rng.choice(wrong)
    in_place = rng.random() < noise.in_place
    source = bug.source(bug.bug)
    printed = "" if in_place else source.replace(_swap(bug.body, bug.op, bug.bug), _swap(bug.body, bug.op, op), 1)
    return [
        (bash_turn("cat *.py"), source),
        (bash_turn(bug.sed(op, in_place)), printed),
        (bash_turn(SUBMIT), ""),
    ]


def _turn_text(turn: dict[str, Any]) -> str:
    from hrl.runners.engines.scripted import render_turn

    return render_turn(turn, "<|im_end|>")


Context = Literal["full", "brief", "bare"]


def episode_requests(
    profile: HarnessProfile,
    task: str,
    turns: list[tuple[dict[str, Any], str]],
    uname: str | None = None,
    context: Context = "full",
) -> tuple[list[dict[str, Any]], list[str]]:
    """The full message list mini-swe-agent would have sent after the last turn (its last request plus the final
    assistant reply), and the assistant turns as the model samples them (Hermes text + end of turn).

    `context` "full" is the harness's; the shorter ones are for a cheap curriculum: "brief" stops the instance
    prompt after the task, "bare" keeps only the task (no system prompt, no tool list)."""
    user = profile.user(task, uname) if context == "full" else profile.before + task
    messages: list[dict[str, Any]] = [{"role": "user", "content": user}]
    if context != "bare":
        messages.insert(0, {"role": "system", "content": profile.system})
    replies = []
    for k, (turn, output) in enumerate(turns):
        text = _turn_text(turn)
        replies.append(text)
        reply = parse_hermes(text.removesuffix("<|im_end|>"))
        calls = [{"id": f"call_{k}", "type": "function", "function": tc["function"]} for tc in reply.tool_calls]
        messages.append({"role": "assistant", "content": reply.content or None, "tool_calls": calls})
        if k < len(turns) - 1:
            messages.append({"role": "tool", "tool_call_id": f"call_{k}", "content": profile.tool_result(output)})
    return messages, replies


def render_ids(
    template: ChatTemplate,
    profile: HarnessProfile,
    task: str,
    turns: list[tuple[dict[str, Any], str]],
    uname: str | None = None,
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one episode, built call by call with the proxy's own prompt planning: each call's
    prompt is the previous call's prompt + sampled ids + the tokenized new messages, as at rollout time."""
    messages, replies = episode_requests(profile, task, turns, uname)
    session, dialect = Session("sft"), ChatDialect()
    ids: list[int] = []
    mask: list[int] = []
    k = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        req = dialect.parse({"model": "m", "messages": messages[:i], "tools": profile.tools}, None)
        plan = session.plan(req, template)
        call = session.open_call("chat", req, plan, f"sft-{k}")
        call.response_ids = template.encode(replies[k])
        session.close_call(call, parse_hermes(template.reply_text(call.response_ids)))
        mask = mask + [0] * (len(plan.prompt_ids) - len(ids)) + [1] * len(call.response_ids)
        ids, k = call.full_ids, k + 1
    return ids, mask


def render_ids_fast(
    template: ChatTemplate,
    profile: HarnessProfile,
    task: str,
    turns: list[tuple[dict[str, Any], str]],
    uname: str | None = None,
    context: Context = "full",
) -> tuple[list[int], list[int]]:
    """`render_ids` in one template render: the same ids, because every joint between a sampled reply and the text
    around it is a special token (checked against `render_ids` by the build and the tests)."""
    messages, _ = episode_requests(profile, task, turns, uname, context)
    tools = None if context == "bare" else profile.tools
    text = template.render(messages, tools, add_generation_prompt=False)
    ids = template.encode(text.removesuffix("\n"))
    head, end = template.encode("<|im_start|>assistant\n"), template.stop_ids
    mask, inside = [0] * len(ids), False
    for i in range(len(ids)):
        if inside:
            mask[i] = 1
            inside = ids[i] not in end
        elif ids[i - len(head) + 1 : i + 1] == head:
            inside = True
    return ids, mask


def episode_messages(profile: HarnessProfile, task: str, turns: list[tuple[dict[str, Any], str]]) -> list[str]:
    """Plain text of an episode's pieces (for the tokenizer's training corpus)."""
    out = [profile.system, profile.user(task), json.dumps(profile.tools)]
    for turn, output in turns:
        out += [_turn_text(turn), profile.tool_result(output)]
    return out
