"""The CPU demo: generated tasks, the harness profile, SFT transcripts token-exact with the proxy, the tiny-agent
build (deterministic, cached, a well-formed first tool call), and `hrl train --recipe demo` end to end."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from hrl.recipes.loader import load_recipe
from hrl.runners.proxy.template import ChatTemplate, parse_hermes
from hrl.runners.serving.stack import serving
from hrl.runners.tasks import TestVerifier, load_tasks
from hrl.sandboxes import get_backend
from hrl.train.tiny.agent import TinyAgentConfig, build_info, build_tiny_agent, file_digests, shipped_model
from hrl.train.tiny.profile import SUBMIT, load_profile
from hrl.train.tiny.tasks import signature, split_tasks, task_bug, wrong_ops
from hrl.train.tiny.transcripts import Noise, episode_requests, render_ids, render_ids_fast, transcript

RECIPE = Path(__file__).resolve().parents[3] / "recipes" / "demo"
# A build small enough for a test (seconds): it learns the episode's fixed shape, not the skill.
SMALL = TinyAgentConfig(
    vocab_size=1024, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128, examples=64,
    bare_steps=40, bare_batch_size=8, brief_steps=10, brief_batch_size=8, steps=10, batch_size=4, lr=1e-2,
)  # fmt: skip


@pytest.fixture(scope="module")
def small_agent(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_agent(tmp_path_factory.mktemp("agent") / "m", SMALL))


# ---- tasks ------------------------------------------------------------------------------------------------------


def test_recipe_task_files_are_the_generator_output_and_disjoint():
    generated = split_tasks()
    for stem, tasks in generated.items():
        assert [t.model_dump() for t in load_tasks(RECIPE / f"{stem}.jsonl")] == [t.model_dump() for t in tasks]
    held = {signature(task_bug(t)) for t in generated["heldout"]}
    train = {signature(task_bug(t)) for t in generated["tasks"]}
    assert len(held) == 48 and len(train) == 240 and not held & train
    recipe = load_recipe("demo")
    assert Path(recipe["tasks"]) == RECIPE / "tasks.jsonl" and recipe["rollout"]["agent"] == "mini-swe-agent"


def test_the_verifier_passes_the_gold_fix_and_fails_the_bug():
    verifier = TestVerifier(get_backend("local"))

    async def grade() -> list[tuple[float | None, float | None]]:
        tasks = load_tasks(RECIPE / "heldout.jsonl")[:2]
        return [((await verifier.grade(t, t.patch)).reward, (await verifier.grade(t, "")).reward) for t in tasks]

    assert asyncio.run(grade()) == [(1.0, 0.0), (1.0, 0.0)]


@pytest.mark.parametrize("index", range(6))
def test_a_transcripts_sed_fixes_the_module_exactly_when_it_should(tmp_path, index):
    task = split_tasks()["tasks"][index]
    bug = task_bug(task)
    for op in [bug.op, *wrong_ops(bug)]:
        for in_place in (True, False):
            (tmp_path / f"{bug.module}.py").write_text(bug.source(bug.bug))
            out = subprocess.run(bug.sed(op, in_place), shell=True, cwd=tmp_path, capture_output=True, text=True)
            fixed = (tmp_path / f"{bug.module}.py").read_text() == bug.source(bug.op)
            assert fixed == (op == bug.op and in_place), (bug.sed(op, in_place), out.stderr)


def test_noise_sets_how_often_a_transcript_is_right():
    bug, rng = task_bug(split_tasks()["tasks"][0]), random.Random(0)
    turns = [transcript(bug, rng, Noise(right_op=0.3, in_place=0.6)) for _ in range(2000)]
    right = sum(t[1][0]["tool_calls"][0]["arguments"]["command"] == bug.sed(bug.op) for t in turns) / len(turns)
    assert 0.14 < right < 0.22  # 0.3 * 0.6 (seeded; and ±4.6σ of a binomial over 2000)
    assert all(t[0][0]["tool_calls"][0]["arguments"]["command"] == "cat *.py" for t in turns)
    assert all(t[2][0]["tool_calls"][0]["arguments"]["command"] == SUBMIT for t in turns)


# ---- transcripts are what the proxy builds ------------------------------------------------------------------------


def _episode(seed: int) -> tuple[str, list, str]:
    task = split_tasks()["tasks"][seed]
    return task.problem_statement, transcript(task_bug(task), random.Random(seed), Noise()), "Linux 6.1 #1 x86_64"


def test_one_shot_rendering_equals_the_proxys_call_by_call_prompts(tiny_model):
    template, profile = ChatTemplate(tiny_model), load_profile()
    for seed in range(4):
        task, turns, uname = _episode(seed)
        ids, mask = render_ids(template, profile, task, turns, uname)
        assert (ids, mask) == render_ids_fast(template, profile, task, turns, uname)
        sampled = template.decode([t for t, m in zip(ids, mask, strict=True) if m])
        assert sampled.count("<tool_call>") == 3 and sampled.endswith(f'{SUBMIT}"}}}}\n</tool_call><|im_end|>')


async def _through_the_proxy(model: str, task: str, turns: list, uname: str) -> dict:
    """Play the transcript's turns from the scripted engine and send mini-swe-agent's requests over HTTP."""
    profile = load_profile()
    messages, _ = episode_requests(profile, task, turns, uname)
    opts = {"turns": [t for t, _ in turns]}
    async with (
        serving(model, "scripted", model_name="m", engine_options=opts) as stack,
        httpx.AsyncClient(timeout=60) as client,
    ):
        token = stack.proxy.open_session().token
        history = messages[:2]
        for k, (_, output) in enumerate(turns):
            body = {"model": "m", "messages": history, "tools": profile.tools}
            reply = (await client.post(f"{stack.url}/s/{token}/v1/chat/completions", json=body)).json()
            msg = reply["choices"][0]["message"]
            history = [*history, {k2: msg[k2] for k2 in ("role", "content", "tool_calls")}]
            tool_id = msg["tool_calls"][0]["id"]
            history.append({"role": "tool", "tool_call_id": tool_id, "content": profile.tool_result(output)})
            assert k < 2 or json.loads(msg["tool_calls"][0]["function"]["arguments"])["command"] == SUBMIT
        return stack.proxy.end_session(token)


def test_sft_tokens_are_what_the_proxy_records_for_the_same_messages(tiny_model):
    from hrl.runners.trace import call_prompt_ids

    task, turns, uname = _episode(1)
    trace = asyncio.run(_through_the_proxy(tiny_model, task, turns, uname))
    last = len(trace["calls"]) - 1
    recorded = call_prompt_ids(trace, last) + trace["calls"][last]["response_ids"]
    ids, mask = render_ids(ChatTemplate(tiny_model), load_profile(), task, turns, uname)
    assert recorded == ids
    sampled = [i for c in trace["calls"] for i in c["response_ids"]]
    assert sampled == [t for t, m in zip(ids, mask, strict=True) if m]


# ---- the build --------------------------------------------------------------------------------------------------


def test_build_is_deterministic_and_cached(tmp_path, small_agent):
    again = build_tiny_agent(tmp_path / "again", SMALL)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (Path(small_agent) / name).read_bytes(), name
    info = build_info(again)
    assert info is not None and info["key"] == SMALL.key() and info["params"] > 0
    events: list[str] = []
    build_tiny_agent(again, SMALL, lambda kind, data: events.append(kind))
    assert events == ["cached"]


def test_the_shipped_model_is_the_default_configs_build_and_matches_its_record():
    shipped = shipped_model()
    assert shipped is not None and shipped == RECIPE / "model"
    info = build_info(shipped)
    assert info["key"] == TinyAgentConfig().key(), "the generator or config changed: rebuild recipes/demo/model"
    assert info["sha256"] == file_digests(shipped) and "model.safetensors" in info["sha256"]
    assert info["config"]["uname"] == "" and info["config"]["threads"] == 2  # no input of the build is the machine's


def test_the_default_model_is_the_shipped_build_copied_then_cached(tmp_path):
    events: list[str] = []
    out = build_tiny_agent(tmp_path / "m", on_event=lambda kind, data: events.append(kind))
    assert events == ["shipped"] and file_digests(out) == file_digests(shipped_model())
    build_tiny_agent(out, on_event=lambda kind, data: events.append(kind))
    assert events == ["shipped", "cached"]


def test_a_damaged_shipped_build_is_refused_not_served(tmp_path, monkeypatch):
    import shutil

    copy = tmp_path / "shipped"
    shutil.copytree(shipped_model(), copy)
    data = bytearray((copy / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (copy / "model.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr("hrl.train.tiny.agent.shipped_model", lambda: copy)
    with pytest.raises(RuntimeError, match="does not match its sha256 record"):
        build_tiny_agent(tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_the_shipped_build_lands_beside_files_of_other_names(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    build_tiny_agent(out)
    assert (out / "notes.txt").read_text() == "mine" and build_info(out)["key"] == TinyAgentConfig().key()


START = Path(__file__).with_name("rebuild_start.json")  # python bench/tiny_agent_rebuild.py --record-start
CI_STEPS = 6  # of the record's 16: a learning rate 1 % off already shows at step 2 (the next test)


@pytest.mark.slow
def test_the_shipped_model_is_rebuilt_from_scratch_as_it_started(tmp_path):
    """CI's check of `hrl models tiny-agent DIR --verify` (the whole rebuild, 10-20 minutes on two cores, is
    bench/tiny_agent_rebuild.py): the default build from scratch writes every file but the weights byte for byte as
    the shipped build, renders its transcripts as the proxy does, and its first CI_STEPS losses are the recorded
    start's within START_RTOL on any CPU. Where they differ, the training itself changed."""
    from hrl.train.tiny.verify import rebuild_start, start_within

    record = json.loads(START.read_text())
    assert record["key"] == TinyAgentConfig().key(), f"the build changed: re-record with `{record['command']}`"
    result = rebuild_start(tmp_path / "m", CI_STEPS)
    assert [r["file"] for r in result["files"] if not r["same"]] == [], result["files"]
    within, worst = start_within(result["losses"], record["losses"][:CI_STEPS])
    assert within, f"max relative difference {worst:.1e}: {result['losses']} vs {record['losses']}"


def test_the_recorded_start_tells_other_rounding_from_other_training():
    """The bound, on the record's own measurements: the build's start with torch's AVX2 and unvectorised kernels (as
    other CPUs round) is within it; with a learning rate 1 % higher it is not."""
    from hrl.train.tiny.verify import START_STEPS, start_within

    record = json.loads(START.read_text())
    assert record["steps"] == START_STEPS and len(record["losses"]) == START_STEPS
    checked = {name: start_within(run["losses"], record["losses"])[0] for name, run in record["checked"].items()}
    assert checked == {"avx2": True, "default": True, "lr_plus_1pct": False}
    head = {name: start_within(run["losses"][:CI_STEPS], record["losses"][:CI_STEPS])[0] for name, run in
            record["checked"].items()}  # fmt: skip
    assert head == checked  # CI's shorter rebuild tells them apart as well
    assert {run["capability"] for run in record["checked"].values()} >= {"AVX2", "DEFAULT"}


def _edited_copy(tmp_path: Path, name: str, edit: Callable[[Path], None], record: bool = False) -> Path:
    """A copy of the shipped build with one file edited; `record` rewrites its sha256 record to match."""
    import shutil

    copy = tmp_path / name
    shutil.copytree(shipped_model(), copy)
    edit(copy)
    if record:
        info = build_info(copy)
        (copy / "tiny_agent.json").write_text(json.dumps({**info, "sha256": file_digests(copy)}, indent=1))
    return copy


def _one_weight_changed(model: Path) -> None:
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))
    weights["model.norm.weight"][0] += 1.0
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})


@pytest.fixture(scope="module")
def behaviours() -> dict[tuple[object, ...], tuple[list[str], float]]:
    """`verify.behaviour` results by the digests of the files they were computed from, for the module: a function of
    those bytes (greedy decoding, one load), it costs seconds of generation a call, and the tests below ask it of the
    shipped build, or of a copy of it, up to five times."""
    return {}


@pytest.fixture
def behaviour_once(monkeypatch: pytest.MonkeyPatch, behaviours: dict) -> None:
    from hrl.train.tiny import verify

    compute = verify.behaviour

    def once(model_dir: str | Path, tasks: int = 48) -> tuple[list[str], float]:
        key = (str(tasks), *sorted(file_digests(model_dir).items()))
        if key not in behaviours:
            behaviours[key] = compute(model_dir, tasks)
        answers, loss = behaviours[key]
        return list(answers), loss

    monkeypatch.setattr(verify, "behaviour", once)


@pytest.mark.usefixtures("behaviour_once")
@pytest.mark.parametrize("mode", ["bytes", "behaviour"])
def test_verify_fails_when_one_weight_of_the_shipped_model_is_changed(tmp_path, monkeypatch, mode):
    """On the builder's machine (bytes) and on any other (behaviour): the shipped build must match its record, so a
    changed weight fails there whatever the rebuild gives; the rebuild itself is the unchanged build here."""
    from hrl.train.tiny import verify

    shipped = build_info(shipped_model())
    here = shipped["machine"] if mode == "bytes" else {**shipped["machine"], "vendor": "elsewhere"}
    monkeypatch.setattr(verify, "machine", lambda: here)
    rebuilt = _edited_copy(tmp_path, "rebuilt", lambda m: None)
    changed = _edited_copy(tmp_path, "changed", _one_weight_changed)
    good = verify.verify_build(rebuilt, shipped_model(), tasks=1)
    bad = verify.verify_build(rebuilt, changed, tasks=1)
    assert (good["mode"], good["verified"]) == (mode, True), good
    assert (bad["mode"], bad["reference_intact"], bad["verified"]) == (mode, False, False), bad
    if mode == "bytes":  # a rebuild that differs in one weight is not the builder's build
        assert not verify.verify_build(changed, shipped_model())["verified"]


def _json_edit(name: str, key: str, value: object) -> Callable[[Path], None]:
    def edit(model: Path) -> None:
        data = json.loads((model / name).read_text())
        (model / name).write_text(json.dumps({**data, key: value}, indent=2) + "\n")

    return edit


def test_a_rebuild_by_another_transformers_release_differs_only_in_its_version_key(tmp_path):
    """save_pretrained writes its own version into config.json and generation_config.json: a rebuild under another
    transformers release is the same build there, and a changed field beside it is not."""
    from hrl.train.tiny.verify import compare_files

    released = _edited_copy(tmp_path, "released", _json_edit("config.json", "transformers_version", "99.0.0"))
    rows = {r["file"]: r for r in compare_files(released, shipped_model())}
    assert rows["config.json"]["same"] and rows["config.json"]["only"] == "transformers_version differs"
    assert all(r["same"] for r in rows.values())
    wider = _edited_copy(tmp_path, "wider", _json_edit("config.json", "hidden_size", 4096))
    assert not {r["file"]: r for r in compare_files(wider, shipped_model())}["config.json"]["same"]


@pytest.mark.usefixtures("behaviour_once")
def test_verify_elsewhere_fails_a_build_of_other_data_or_a_model_that_learnt_less(tmp_path, monkeypatch):
    """Off the builder's machine: another tokenizer (the generated data changed), another architecture, or weights
    that have not learnt the fixed turns each fail, even with a record that matches their files."""
    from safetensors.torch import load_file, save_file

    from hrl.train.tiny import verify

    monkeypatch.setattr(verify, "machine", lambda: {"vendor": "elsewhere"})

    def other_tokenizer(m: Path) -> None:
        (m / "tokenizer.json").write_text((m / "tokenizer.json").read_text().replace('"ChatML"', '"ChatmL"', 1) + " ")

    def untrained(m: Path) -> None:
        weights = load_file(str(m / "model.safetensors"))
        save_file({k: v * 0.5 for k, v in weights.items()}, str(m / "model.safetensors"), metadata={"format": "pt"})

    def dropped_tensor(m: Path) -> None:
        weights = load_file(str(m / "model.safetensors"))
        save_file({k: v for k, v in weights.items() if k != "model.norm.weight"}, str(m / "model.safetensors"))

    for name, edit, failed in [("tokenizer", other_tokenizer, "other_files_same"),
                               ("untrained", untrained, "loss_within"),
                               ("tensor", dropped_tensor, "tensors_same")]:  # fmt: skip
        result = verify.verify_build(_edited_copy(tmp_path, name, edit, record=True), shipped_model(), tasks=1)
        assert result["mode"] == "behaviour" and not result["checks"][failed] and not result["verified"], name


def test_a_build_records_the_machine_its_floats_depend_on():
    from hrl.train.tiny.agent import FLOAT_FLAGS, machine

    here, shipped = machine(), build_info(shipped_model())["machine"]
    assert set(here) == set(shipped) == {"torch", "vendor", "capability", "flags"}
    assert set(here["flags"]) <= set(FLOAT_FLAGS) and here["torch"] == shipped["torch"]


def test_the_model_answers_a_task_prompt_with_a_well_formed_tool_call(small_agent):
    import torch
    from transformers import AutoModelForCausalLM

    profile, template = load_profile(), ChatTemplate(small_agent)
    task = load_tasks(RECIPE / "heldout.jsonl")[0]
    messages = [
        {"role": "system", "content": profile.system},
        {"role": "user", "content": profile.user(task.problem_statement)},
    ]
    prompt = template.encode(template.render(messages, profile.tools))
    model = AutoModelForCausalLM.from_pretrained(small_agent).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=40, do_sample=False, eos_token_id=list(template.stop_ids)
        )
    reply = parse_hermes(template.reply_text(out[0, len(prompt) :].tolist()))
    assert [c["function"]["name"] for c in reply.tool_calls] == ["bash"], reply
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == {"command": "cat *.py"}


def test_cli_builds_with_a_summary(tmp_path, small_agent, monkeypatch):
    from typer.testing import CliRunner

    from hrl.cli.main import app

    # SMALL's data, tokenizer and shape (its parameters are small_agent's) trained for one step: the command's build,
    # not the training, which small_agent and the build tests above cover
    one_step = {"bare_steps": 1, "brief_steps": 0, "steps": 0}
    monkeypatch.setattr("hrl.train.tiny.agent.TinyAgentConfig", lambda **kw: SMALL.model_copy(update=one_step | kw))
    result = CliRunner().invoke(app, ["models", "tiny-agent", str(tmp_path / "m"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["path"] == str(tmp_path / "m") and summary["params"] == build_info(small_agent)["params"]
    assert build_info(tmp_path / "m")["config"] == SMALL.model_copy(update=one_step).model_dump()  # trained, not copied


# ---- the real harness ---------------------------------------------------------------------------------------------


@pytest.mark.agents
@pytest.mark.timeout(900)
def test_the_profile_matches_what_mini_swe_agent_sends(tiny_model):
    from hrl.train.tiny.profile import capture_profile

    captured = asyncio.run(capture_profile(tiny_model, "local"))
    shipped = load_profile()
    assert captured.__dict__ == {**shipped.__dict__, "uname": captured.uname}


@pytest.mark.agents
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_hrl_train_recipe_demo_runs_end_to_end(tmp_path, small_agent):
    run = tmp_path / "run"
    heldout = tmp_path / "heldout.jsonl"  # two of the recipe's held-out tasks: evaluated before and after the update
    heldout.write_text("".join((RECIPE / "heldout.jsonl").read_text().splitlines(keepends=True)[:2]))
    args = ["train", "--recipe", "demo", "--model", small_agent, "--run-dir", str(run), "-c", f"eval_tasks={heldout}",
            "-c", "train.iterations=1", "-c", "train.tasks_per_iteration=2", "-c", "train.group_size=2"]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "hrl.cli", *args], capture_output=True, text=True, timeout=850)
    assert proc.returncode == 0, proc.stderr[-3000:]
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "eval/success" in line]
    traces = [json.loads(line) for line in (run / "traces" / "iter-0000.jsonl").read_text().splitlines()]
    assert len(traces) == 4 and all(t["reward"] in (0.0, 1.0) for t in traces), [t["failure_reason"] for t in traces]
    assert all(t["agent"]["name"] == "mini-swe-agent" and len(t["calls"]) >= 1 for t in traces)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "eval/" not in line]
    # A group whose two rewards differ trains and publishes version 1; where every group's agree (this barely
    # trained agent mostly fails), the step trains on nothing and publishes nothing: version 0, no checkpoint.
    signal = any(len({t["reward"] for t in traces if t["group_id"] == g}) > 1 for g in {t["group_id"] for t in traces})
    version = 1 if signal else 0
    assert [(m["step"], m["eval/episodes"], m["eval/version"]) for m in evals] == [(0, 2, 0), (1, 2, version)]
    assert metrics[-1]["version"] == version and metrics[-1]["train/empty"] == float(not signal)
    assert len((run / "eval" / "step-0001.jsonl").read_text().splitlines()) == 2
    assert "held-out tasks" in proc.stderr and "success" in proc.stderr  # the before/after table
    assert "report: hrl report" in proc.stderr
    checkpoint = run / "checkpoints" / "v0001"
    if not signal:  # a LoRA checkpoint as the recipe's trainer saves one, for the rest
        from hrl.train.trainer import Trainer, TrainerConfig

        Trainer(TrainerConfig(model=small_agent, mode="lora", lora_rank=16)).save(checkpoint)
    assert (checkpoint / "adapter_model.safetensors").is_file()  # the recipe's LoRA
    # the LoRA checkpoint is evaluated like any model (its base is served, the adapter published as policy 1)
    out = tmp_path / "eval.jsonl"
    args = ["rollout", "--agent", "mini-swe-agent", "--recipe", "demo", "--tasks", str(RECIPE / "heldout.jsonl"),
            "--model", str(checkpoint), "--limit", "1", "--out", str(out)]  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "hrl.cli", *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    (trace,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert trace["reward"] in (0.0, 1.0) and {v for c in trace["calls"] for _, v in c["versions"]} == {1}
