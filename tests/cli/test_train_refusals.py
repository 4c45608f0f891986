"""`hrl train` refuses loop settings that cannot work before anything starts: exit 2, one `Error:` naming the fields
and their values, one `Hint:`, no run directory. An async buffer that cannot hold a batch would leave the trainer
waiting forever, silently; `pin` with full publishes would silently run as `mixed`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrl.runners.rundir import RunDir
from tests.cli.test_error_policy import USAGE, run_hrl

ASYNC = ("train", "--recipe", "demo", "--async", "--model", "hrl:tiny", "--run-dir", "run")  # groups of 8


@pytest.mark.parametrize(
    ("argv", "needles", "hint"),
    [
        (  # 8 in flight, one group before the buffer is full: 8 traces, never 16
            (*ASYNC, "-c", "async.max_buffered=2", "-c", "async.batch_traces=16"),
            ("async.max_buffered=2", "async.max_in_flight=8", "async.batch_traces=16", "at most 8"),
            "async.max_buffered=16",
        ),
        (  # 32 in flight fill the first batch, but a step can leave 8 waiting and nothing running
            (*ASYNC, "-c", "async.max_buffered=2", "-c", "async.batch_traces=16", "-c", "async.max_in_flight=32"),
            ("async.max_buffered=2", "async.batch_traces=16", "train.group_size=8", "leaves 8 waiting"),
            "async.max_buffered=16",
        ),
        (
            ("train", "--recipe", "demo", "--full", "--model", "hrl:tiny", "-c", "proxy.version_policy=pin"),
            ("proxy.version_policy=pin", "trainer.mode=full"),
            "proxy.version_policy=mixed",
        ),
        (  # the teacher's signal alone, and no teacher
            ("train", "--recipe", "demo", "--model", "hrl:tiny", "-c", "train.advantage=distill"),
            ("train.advantage=distill", "no distill.teacher"),
            "-c distill.teacher=MODEL",
        ),
        (  # an online run's advantages are its clients' rewards alone: no teacher there yet
            ("train", "--recipe", "demo", "--serve", "--model", "hrl:tiny", "-c", "distill.teacher=hrl:tiny"),
            ("distill.teacher=hrl:tiny", "--serve"),
            "sync or --async",
        ),
    ],
)
def test_settings_that_cannot_work_are_refused_before_anything_starts(
    argv, needles, hint, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    code, _out, err = run_hrl(list(argv), {"HRL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    hints = [line for line in err.splitlines() if line.startswith("Hint: ")]
    assert code == USAGE and len(errors) == 1 and len(hints) == 1, err
    assert all(n in errors[0] for n in needles), errors[0]
    assert hint in hints[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()
    assert not (tmp_path / "cache").exists()  # refused before the model was built


def test_a_teacher_with_another_tokenizer_is_refused_before_anything_starts(
    tiny_model, family_model, tmp_path, monkeypatch, capsys
):
    """distill.teacher scores the student's token ids as they are: a teacher whose tokenizer maps them to other
    tokens is refused (exit 2) once both models are real, before a run directory, engine or sandbox exists."""
    monkeypatch.chdir(tmp_path)
    teacher = family_model("llama3")  # the same BPE trained with another family's special tokens: other ids
    argv = ["train", "--recipe", "demo", "--model", tiny_model, "-c", f"distill.teacher={teacher}", "--run-dir", "run"]
    code, _out, err = run_hrl(argv, {"HRL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert code == USAGE and len(errors) == 1, err
    assert f"distill.teacher={teacher} has another tokenizer than the student" in errors[0], errors[0]
    assert "special tokens differ" in errors[0] and "Hint: give a teacher of the student's family" in err
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


def test_a_run_written_before_the_checks_is_refused_on_resume(tmp_path, monkeypatch, capsys):
    run = RunDir(tmp_path / "run")
    run.create({"model": "m", "tasks": "t.jsonl", "train": {"group_size": 4}, "trainer": {"model": "m"},
                "async": {"enabled": True, "max_buffered": 3, "batch_traces": 8, "max_in_flight": 4}})  # fmt: skip
    run.save_state(0, 0, None)
    before = json.loads((run.path / "config.json").read_text())
    code, _out, err = run_hrl(["train", "--run-dir", str(run.path), "--resume"], {}, monkeypatch, capsys)
    assert code == USAGE and "async.max_buffered=3 and async.max_in_flight=4 can never fill" in err, err
    assert json.loads((run.path / "config.json").read_text()) == before and not Path(run.path / "lock").exists()


def test_a_teacher_server_that_does_not_answer_is_refused_before_the_run_starts(tmp_path, monkeypatch, capsys):
    """distill.teacher as a URL is checked once the student is found (its tokenizer is compared through the server's
    /tokenize): a server that does not answer is refused then, before the run directory, engine or sandboxes."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--recipe", "demo", "--model", "hrl:tiny", "-c", "distill.teacher=http://127.0.0.1:9/v1"]
    code, _out, err = run_hrl(argv, {"HRL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert code == USAGE and "distill.teacher=http://127.0.0.1:9/v1" in err and "did not answer" in err, err
    assert "Hint: start the teacher's vLLM server first" in err
    assert not (tmp_path / "runs").exists()


VLLM = ("train", "--recipe", "demo", "--engine", "vllm", "--model", "hrl:tiny", "--run-dir", "run")


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (("--async", "-c", "engine_options.sleep_level=1"), ("engine_options.sleep_level=1", "never sleeps")),
        (("--serve", "-c", "engine_options.sleep_level=2"), ("engine_options.sleep_level=2", "never sleeps")),
        (
            ("--full", "-c", "engine_options.weight_sync=ipc", "-c", "engine_options.tensor_parallel_size=2"),
            ("weight_sync=ipc", "tensor_parallel_size=2"),
        ),
        (
            (
                "--full",
                "-c",
                "engine_options.weight_sync=ipc",
                "-c",
                "trainer.device=cuda:0",
                "-c",
                "trainer.gpus=[1]",
                "-c",
                "engine_options.gpus=[0]",
            ),
            ("weight_sync=ipc", "GPU 1", "GPU 0", "split layout"),
        ),
        (
            ("--full", "-c", "engine_options.weight_sync=ipc", "-c", "trainer.device=cuda:0", "-c", "trainer.nproc=2"),
            ("weight_sync=ipc", "trainer.nproc=2"),
        ),
        (("--lora", "-c", "engine_options.weight_sync=ipc"), ("weight_sync=ipc", "trainer.mode=lora")),
        (
            ("--full", "-c", "engine_options.weight_sync=ipc", "-c", "trainer.device=cpu"),
            ("weight_sync=ipc", "trainer.device=cpu"),
        ),
        (("--full", "-c", "trainer.device=cuda:0"), ("share GPU 0", "sleep_level=0", "0.9")),
        (
            ("--async", "-c", "trainer.device=cuda:1", "-c", "engine_options.tensor_parallel_size=2"),
            ("share GPU 1", "0.9"),
        ),
    ],
)
def test_engine_settings_a_layout_cannot_honour_are_refused_before_anything_starts(
    extra, needles, tmp_path, monkeypatch, capsys
):
    """A sleeping engine in the async loop (which never sleeps or wakes it: the trainer would be built beside vLLM's
    whole share), CUDA-IPC publishes the layout cannot carry (which failed at the first publish, after a whole
    rollout and update, or went by disk without a word) and a never-sleeping engine at vLLM's default share on the
    trainer's GPU: exit 2 before a model or engine is touched."""
    monkeypatch.chdir(tmp_path)
    code, _out, err = run_hrl([*VLLM, *extra], {"HRL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    errors = [line for line in err.splitlines() if line.startswith("Error: ")]
    assert code == USAGE and len(errors) == 1, err
    assert all(n in errors[0] for n in needles), errors[0]
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_the_memory_share_is_not_refused_where_ray_gives_the_trainer_its_own_gpus(tmp_path, monkeypatch, capsys):
    """The shared-GPU refusal above reads this machine's layout; with the trainer's ranks on Ray (each given its GPU
    by Ray, apart from the replicas') it does not apply, and the plan goes through."""
    monkeypatch.chdir(tmp_path)
    argv = [*VLLM, "--full", "-c", "trainer.device=cuda:0", "--placement", "ray", "-c", "placement.trainer=ray",
            "--dry-run"]  # fmt: skip
    code, out, err = run_hrl(argv, {"HRL_CACHE": str(tmp_path / "cache")}, monkeypatch, capsys)
    assert code == 0 and "share GPU" not in err, err
    assert "rank as a Ray actor" in out
