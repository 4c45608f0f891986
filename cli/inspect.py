"""`hrl inspect`: a trace file as a summary table; one trace as the conversation the agent lived (a tree of its
calls, each with what the model was shown and what it said, decoded with the model's tokenizer, the tool events
between them, the outcome), and its branches; a run directory as one row per iteration with sparkline trends."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from hrl.cli.options import DecodeModelOption
from hrl.cli.output import emit, err
from hrl.cli.tables import plain_table, short_count, short_secs, stdout_console

__all__ = ["EPILOG", "inspect"]

EPILOG = """Examples:

  hrl inspect traces.jsonl                           # one row per trace, totals below

  hrl inspect a.jsonl b.jsonl                        # several files (or a folder of them) as one table

  hrl inspect traces.jsonl --trace 3f2a              # one trace (id prefix or session): the conversation

  hrl inspect traces.jsonl --trace 3f2a --full -m Qwen/Qwen3-8B   # every line, decoded with that tokenizer

  hrl inspect traces.jsonl --trace 3f2a --samples    # ... plus its branches (the training samples)

  hrl inspect traces.jsonl --json | jq '.[] | select(.status != "ok") | .failure_reason'

  hrl inspect traces.jsonl --trace 3f2a --json | jq '.conversation.calls[] | [.call_id, .reply.tool_calls]'

  hrl inspect runs/demo                              # a run: one row per iteration, trends as sparklines

  hrl inspect runs/demo --json | jq '.[] | [.iteration, .metrics["trace/reward"]]'

  hrl inspect runs/demo --trace 3f2a                 # one trace of the run, found in any iteration
"""

Trace = dict[str, Any]


def inspect(
    sources: Annotated[
        list[Path],
        typer.Argument(
            metavar="FILE...|RUN_DIR",
            help="hrl.trace/1 JSONL files (the --out of `hrl rollout`, `hrl serve --traces`), or a run directory.",
        ),
    ],
    trace_id: Annotated[
        str | None,
        typer.Option("--trace", "-t", help="Show only this trace (an id, a unique id prefix, or its session token)."),
    ] = None,
    samples: Annotated[
        bool, typer.Option("--samples", help="Also list the branches: the root-to-leaf paths that become samples.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print summaries as JSON (an object with --trace).")] = False,
    full: Annotated[
        bool, typer.Option("--full", help="With --trace: every line of every text (else long ones are cut).")
    ] = False,
    model: DecodeModelOption = None,
) -> None:
    """Summarize trace files: outcome, reward, success (the task's own pass/fail), agent, calls, turns, tokens,
    branches and timing per trace. With --trace (or a file of one trace) the conversation: each call in time order
    with its timing, the prompt tokens it added (the task, tool results) and the model's reply (reasoning, text,
    tool calls with arguments) decoded with the model's tokenizer, the tool events, then reward, tests and the test
    output. For a run directory: reward, success rate, failures by reason, latencies, tokens and staleness per
    iteration, with trends (--json: per iteration)."""
    from hrl.cli.report import warn_cut_lines
    from hrl.runners.report.run import load_source
    from hrl.runners.rundir import is_run_dir
    from hrl.runners.summary import chosen_traces

    run = load_source(sources)
    warn_cut_lines(run)
    if is_run_dir(run.path) and trace_id is None:
        from hrl.cli.inspect_run import inspect_run

        inspect_run(run, as_json=as_json)
        return
    chosen = chosen_traces([t for _, t in run.traces], trace_id, sources)
    single = trace_id is not None or (len(chosen) == 1 and not as_json)  # one trace: its conversation
    conv = _conversation(chosen[0], run, model, full) if single else None
    if as_json:
        from hrl.runners.summary import describe_traces

        emit(describe_traces(chosen, conv, samples=samples), as_json=True)
        return
    _render(stdout_console(), chosen, conv, samples=samples)


def _conversation(trace: Trace, run: Any, model: str | None, full: bool) -> dict[str, Any]:
    """The trace's conversation, decoded with `model`'s tokenizer (default: the run's or the trace's model); without
    one, a note on stderr says so once and the conversation has token counts in place of text."""
    from hrl.runners.conversation import conversation, decoding_template

    template, note = decoding_template([trace], run.config, model)
    if note:
        err.print(f"Note: {note}: showing token counts without text (--model DIR decodes with that tokenizer)",
                  markup=False, highlight=False)  # fmt: skip
    return conversation(trace, template, max_lines=None if full else _MAX_LINES, note=note)


_MAX_LINES = 20  # lines of one text shown without --full


def _render(console: Console, traces: list[Trace], conv: dict[str, Any] | None, *, samples: bool) -> None:
    """Table of summaries; the conversation when one trace is shown; totals when several; branches with
    --samples."""
    from hrl.runners.summary import summarize_file, summarize_trace

    console.print(_summary_table([summarize_trace(t) for t in traces], wide=console.width >= 160))
    console.print()
    console.print(_trace_tree(traces[0], conv) if conv is not None else _totals(summarize_file(traces)))
    if samples:
        console.print()
        console.print(Text("branches (training samples)", style="bold"))
        console.print(_branches_table(traces))


# ---- formatting --------------------------------------------------------------------------------------------


def _short(trace_id: Any) -> str:
    return str(trace_id)[:8]


def _outcome(s: dict[str, Any]) -> Text:
    """`ok`, or the failure reason when there is one (the status is then `failed`)."""
    flag = Text(" degenerate", style="yellow") if s.get("degenerate") else Text("")
    if s.get("dropped_media"):
        flag.append(" media", style="yellow")
    if s["failure_reason"]:
        return Text.assemble((str(s["failure_reason"]), "red"), flag)
    return Text.assemble((str(s["status"]), "green" if s["status"] == "ok" else "yellow"), flag)


def _summary_table(sums: list[dict[str, Any]], wide: bool = False) -> Table:
    """One row per trace. In 100 columns the task, agent and status are cut to fit; `wide` (160 columns or more, as
    when piped) shows task ids whole up to 60 characters (SWE-bench's and synthesized ones are 20 to 40)."""
    table = plain_table(padding=0)  # 11 columns in 100: one space between them
    table.add_column("trace", no_wrap=True, min_width=8)
    table.add_column("task", max_width=60 if wide else 16, overflow="ellipsis", no_wrap=True)
    table.add_column("agent", max_width=24 if wide else 14, overflow="ellipsis", no_wrap=True)
    table.add_column("status", max_width=28 if wide else 16, overflow="ellipsis", no_wrap=True)
    columns = (("reward", 6), ("success", 7), ("calls", 5), ("turns", 5), ("prompt", 6), ("resp", 6), ("br", 2),
               ("time", 6))  # fmt: skip
    for name, width in columns:
        table.add_column(name, justify="right", no_wrap=True, min_width=width)
    for s in sums:
        reward = "-" if s["reward"] is None else f"{s['reward']:.3g}"
        table.add_row(
            Text(_short(s["trace_id"])),
            Text(str(s["task_id"] or "-")),
            Text(str(s["agent"] or "-")),
            _outcome(s),
            reward,
            _yes_no(s.get("success")),
            str(s["calls"]),
            str(s["turns"]),
            short_count(s["prompt_tokens"]),
            short_count(s["response_tokens"]),
            str(s["branches"]),
            short_secs(s["duration_s"]),
        )
    return table


def _totals(agg: dict[str, Any]) -> Text:
    """Two lines under the table: outcomes and reward, then tokens and latency percentiles."""
    status = ", ".join(f"{n} {k}" for k, n in sorted(agg["status"].items(), key=lambda kv: (kv[0] != "ok", kv[0])))
    fails = ", ".join(f"{k} {n}" for k, n in sorted(agg["failures"].items()))
    unrewarded = agg["traces"] - agg["rewarded"]
    reward = "no rewarded trace" if agg["reward_mean"] is None else f"mean reward {agg['reward_mean']:.3g}"
    reward += f" ({unrewarded} without a reward)" if unrewarded else ""
    reward += f" · success {agg['succeeded']}/{agg['graded']}" if agg.get("graded") else ""
    lat, tok = agg["latency_s"], agg["tokens"]
    first = f"{agg['traces']} traces: {status}" + (f" ({fails})" if fails else "") + f" · {reward}"
    flags = [f"{agg[k]} {name}" for k, name in (("degenerate", "degenerate"), ("tool_parse_errors",
             "tool parse errors"), ("dropped_media", "with dropped media")) if agg.get(k)]  # fmt: skip
    first += "".join(f" · {f}" for f in flags)
    second = (
        f"tokens {short_count(tok['prompt'])} prompt / {short_count(tok['response'])} response · "
        f"time p50 {short_secs(lat['duration']['p50'])} p95 {short_secs(lat['duration']['p95'])} · "
        f"call p50 {short_secs(lat['call']['p50'])} p95 {short_secs(lat['call']['p95'])}"
    )
    return Text(f"{first}\n{second}")


_LEGEND = "call  @start  dialect  prompt→response tokens  finish  versions  first-token/total  ← parent"


def _call_label(c: dict[str, Any], first: bool) -> Text:
    """One call on one line, in the order of `_LEGEND`; flags `side`, `nostream`; an error on a second line."""
    kind = c["dialect"] + (" side" if c["side"] else "") + ("" if c["stream"] else " nostream")
    kind += "" if c.get("trainable", True) else " untrained"
    versions = ",".join(f"v{v}" for v in c["versions"]) or "v-"
    label = Text.assemble(
        (c["call_id"], "bold"),
        f"  @{short_secs(c['started_at'])}  {kind}  "
        f"{short_count(c['prompt_tokens'])}→{short_count(c['response_tokens'])}  ",
        (c["finish_reason"], "cyan"),
        f"  {versions}  {c['first_token_s']:.2f}/{short_secs(c['total_s'])}",
    )
    if c["parent"] is not None:
        label.append(f"  ← {c['parent']}", style="dim")
    elif not (first or c["side"]):
        label.append("  new root", style="yellow")
    if c["error"]:
        label.append(f"\nerror: {c['error']}", style="red")
    if c.get("tool_parse_error"):
        label.append(f"\ntool call not parsed (sent as text): {c['tool_parse_error']}", style="yellow")
    if c.get("dropped_media"):
        from hrl.runners.summary import media_text

        label.append(f"\ndropped media (proxy.media: drop): {media_text(c['dropped_media'])}", style="yellow")
    for m in c.get("media") or []:  # the images the model saw, where the engine expanded each
        offset, length = m.get("placeholder") or ("?", "?")
        label.append(f"\nimage {m['sha256'][:12]} {m.get('mime', '')} {m.get('width')}×{m.get('height')} "
                     f"{m.get('bytes')} B: prompt tokens {offset}+{length}", style="cyan")  # fmt: skip
    return label


def _tool_label(t: dict[str, Any]) -> Text:
    dur = max(0.0, float(t.get("ended_at", 0.0)) - float(t.get("started_at", 0.0)))
    return Text(f"tool {t.get('name', '?')}  @{short_secs(t.get('started_at'))}  {short_secs(dur)}", style="magenta")


def _yes_no(success: bool | None) -> str:
    return "-" if success is None else "yes" if success else "no"


def _reward_label(trace: Trace) -> Text:
    from hrl.runners.trace import trace_success

    reward = trace.get("reward")
    label = Text("reward " + ("-" if reward is None else f"{reward:g}"), style="bold")
    label.append(f" · success {_yes_no(trace_success(trace))}", style="bold")
    from hrl.runners.conversation import info_text

    info = {k: v for k, v in (trace.get("reward_info") or {}).items() if k not in ("tests", "log")}  # own nodes
    if text := info_text(info):
        label.append("  " + (text if len(text) <= 70 else text[:69] + "…"))
    return label


def _turn(node: Tree, turn: dict[str, Any]) -> None:
    """Under a call's line: the prompt tokens it added, then the reply (reasoning, text, each tool call)."""
    given, reply = turn["input"], turn["reply"]
    if given["text"] is not None:
        head = (
            f"prompt ({given['tokens']} tokens)"
            if given["since"] is None
            else f"+{given['tokens']} prompt tokens after {given['since']} (tool results, new messages)"
        )
        node.add(Text.assemble((head, "dim"), "\n", given["text"]))
    if reply["reasoning"]:
        node.add(Text.assemble(("reasoning", "dim"), "\n", (reply["reasoning"], "italic")))
    if reply["text"]:
        node.add(Text.assemble(("says", "dim"), "\n", reply["text"]))
    for call in reply["tool_calls"]:
        node.add(Text.assemble(("tool call ", "bold magenta"), (call["name"], "bold"), " ", call["arguments"]))


def _outcome_nodes(tree: Tree, outcome: dict[str, Any]) -> None:
    """Each test's outcome (failing ones first) and the test output's tail, under the reward line."""
    if tests := outcome["tests"]:
        bad = sorted(tests.items(), key=lambda kv: (kv[1] in ("PASSED", "XFAIL"), kv[0]))
        lines = "\n".join(f"{o}  {t}" for t, o in bad)
        ok = sum(o in ("PASSED", "XFAIL") for o in tests.values())
        tree.add(Text.assemble((f"tests: {ok}/{len(tests)} passed", "bold"), "\n", lines))
    if outcome["log"]:
        tree.add(Text.assemble(("test output", "bold"), "\n", outcome["log"]))


def _trace_tree(trace: Trace, conv: dict[str, Any]) -> Tree:
    """trace → calls (each with what it was shown and what it said) and tool events in time order (a tool sorts
    after the call that asked for it) → outcome: reward, tests, test output."""
    from hrl.runners.summary import describe_calls, media_text, timeline
    from hrl.runners.trace import dropped_media

    agent, model = trace.get("agent") or {}, trace.get("model") or {}
    head = Text.assemble(("trace ", "bold"), str(trace["trace_id"]), f"  task {trace.get('task_id') or '-'}")
    who = " · ".join(str(x) for x in (agent.get("name"), model.get("name")) if x)
    if who:
        head.append(f"\n{who}", style="dim")
    head.append(f"\n{_LEGEND}", style="dim")
    tree = Tree(head)
    nodes = _agent_nodes(tree, trace)
    calls, tools, turns = describe_calls(trace), trace.get("tools") or [], conv["calls"]
    for kind, i, first in timeline(trace):
        if kind == "tool":
            nodes(None).add(_tool_label(tools[i]))
        else:
            _turn(nodes(calls[i].get("agent")).add(_call_label(calls[i], first)), turns[i])
    _outcome_nodes(tree.add(_reward_label(trace)), conv["outcome"])
    if trace.get("failure_reason"):
        tree.add(Text(f"failed: {trace['failure_reason']}", style="bold red"))
    if trace.get("degenerate"):
        tree.add(Text("degenerate: one model call for an agentic task", style="bold yellow"))
    if media := dropped_media(trace):
        tree.add(Text(f"dropped media: {media_text(media)} (left out of training by default)", style="bold yellow"))
    return tree


def _agent_nodes(tree: Tree, trace: Trace) -> Any:
    """The tree of agents (when the trace has sub-agents): a function from an agent's name (None: the root agent)
    to its node, made on first use under its parent's node, so each agent sits where its first event falls."""
    agents = {a["name"]: a for a in trace.get("agents") or []}
    root = next(iter(agents), None)
    nodes: dict[str | None, Tree] = {}

    def node(name: str | None) -> Tree:
        if root is None:
            return tree
        if name not in nodes:
            a = agents[root if name is None else name]
            parent = tree if name is None else node(None if a["parent"] == root else a["parent"])
            flag = "" if a["trainable"] else "  untrained"
            label = Text.assemble(("agent ", "bold"), (a["name"], "bold green"), f"  {a['calls']} calls{flag}")
            nodes[name] = parent.add(label)
        return nodes[name]

    return node


def _branches_table(traces: list[Trace]) -> Table:
    from hrl.runners.summary import describe_branches

    several = len(traces) > 1
    table = plain_table()
    if several:
        table.add_column("trace", no_wrap=True)
    table.add_column("calls (root → leaf)", overflow="fold")
    for name in ("tokens", "loss", "versions"):
        table.add_column(name, justify="right", no_wrap=True)
    for t in traces:
        for b in describe_branches(t):
            path = " → ".join(b["calls"]) + (" (side)" if b["side"] else "")
            versions = "-" if b["first_version"] is None else f"v{b['first_version']}→v{b['last_version']}"
            row = [Text(path), short_count(b["tokens"]), short_count(b["loss_tokens"]), versions]
            table.add_row(*([Text(_short(t["trace_id"]))] if several else []), *row)
    return table
