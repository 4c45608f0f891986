"""`hrl doctor --model M` through the real CLI: the served-model probe's findings and the publish check, human and
--json."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def hrl_doctor(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "hrl.cli", "doctor", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=540, env={**os.environ, "NO_COLOR": "1"})


def test_probe_findings_human_and_json(tiny_model):
    human = hrl_doctor("--model", tiny_model, "--engine", "scripted")
    assert "✓ tool parser   hermes (detected" in human.stdout
    assert "✓ reasoning     think (detected" in human.stdout
    assert "! tool calls    none of 3 replies called a tool" in human.stdout  # a finding, not a failure
    assert "✓ logprobs      not checked: the scripted engine samples nothing" in human.stdout
    data = {
        c["name"]: c for c in json.loads(hrl_doctor("--model", tiny_model, "--engine", "scripted", "--json").stdout)
    }
    assert data["tool calls"]["ok"] is False and data["tool calls"]["blocking"] is False
    blocking_failed = [c for c in data.values() if c["blocking"] and not c["ok"]]
    assert human.returncode == (4 if blocking_failed else 0), human.stderr


def test_no_probe_starts_nothing(tiny_model):
    out = hrl_doctor("--model", tiny_model, "--no-probe", "--json")
    names = [c["name"] for c in json.loads(out.stdout)]
    assert "tool parser" in names and "tool calls" not in names and "logprobs" not in names


def _publish_checks(out: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    for kind, tier in (("lora", "lora-adapter"), ("full", "disk-reload")):
        check = checks[f"publish {kind}"]
        fig = check["figures"]
        assert check["ok"], check["detail"]
        assert fig["tier"] == tier and fig["bytes"] > 0 and fig["reply_tokens"] == 16, fig
        assert fig["max_abs_dlogp"] <= fig["tolerance"] == 1e-3, fig  # float32 tiny model
        assert fig["publish_effect"] >= 4 * fig["tolerance"], fig  # the perturbed copy changed the logprobs
        assert fig["stale_versions"] == [] and fig["prefix_tokens"] == 512, fig
    assert out.returncode == 0, out.stderr
    return checks


def test_publish_check_on_the_embedded_engine(tiny_model):
    out = hrl_doctor("--model", tiny_model, "--engine", "embedded", "--no-probe", "--publish-check", "--json")
    checks = _publish_checks(out)
    assert checks["publish full"]["figures"]["prefix_tokens_reused"] is None  # it keeps no prefix cache
    human = hrl_doctor("--model", tiny_model, "--engine", "embedded", "--no-probe", "--publish-check",
                       "--publish-kind", "lora")  # fmt: skip
    assert "✓ publish lora  tier lora-adapter" in human.stdout and "publish full" not in human.stdout, human.stdout


def test_a_check_that_times_out_is_named_after_the_checks_done(tiny_model):
    """A served check past --timeout ends the run with exit 1: --json prints the checks done so far and the failed
    one, and the error names it, how long it ran and a longer --timeout, with no "bug" wording. Before, a publish
    check that timed out printed `Error: TimeoutError`, "this is a bug in hrl", and no check at all."""
    out = hrl_doctor("--model", tiny_model, "--engine", "embedded", "--no-probe", "--publish-check", "--timeout",
                     "1e-06", "--json")  # fmt: skip
    assert out.returncode == 1, out.stderr
    checks = json.loads(out.stdout)
    assert [c["name"] for c in checks][-2:] == ["tool parser", "publish lora"], checks  # publish full never ran
    failed = checks[-1]
    assert not failed["ok"] and failed["figures"]["expired"] and failed["detail"].startswith("timed out after ")
    errors = [line for line in out.stderr.splitlines() if line.startswith(("Error: ", "Hint: "))]
    assert errors[0].startswith("Error: the publish lora check timed out after "), errors
    assert errors[0].endswith("(its limit of 1e-06 s)"), errors
    assert errors[1] == "Hint: a loaded machine is slower: re-run with --timeout 2e-06, or when the machine is idle"
    assert "bug" not in out.stderr and len(errors) == 2, out.stderr


@pytest.mark.vllm
@pytest.mark.full  # CI: test_vllm.py's logprob parity and publish check, and the publish check on the embedded engine
@pytest.mark.timeout(600)
def test_vllm_cpu_raw_logprobs_and_publish_check(tiny_model):
    """One vLLM server: the probe (its sampled logprobs are raw) and the publish check for a LoRA adapter and a full
    disk reload, each a reply on a cached 512-token prefix against a fresh re-score by the new weights. The same check
    with the prefix-cache reset taken out fails: tests/runners/engines/test_vllm.py."""
    out = hrl_doctor("--model", tiny_model, "--engine", "vllm", "--publish-check", "--json")
    checks = _publish_checks(out)
    lp = checks["logprobs"]
    assert lp["ok"] and "vLLM logprobs mode raw_logprobs" in lp["detail"], lp["detail"]
    print("\n" + "\n".join(checks[f"publish {k}"]["detail"] for k in ("lora", "full")))


def test_a_template_that_cannot_show_tools_is_stated(tiny_model, tmp_path):
    """SmolLM2's plain ChatML template renders no tool: doctor says so and what the proxy does instead (the hermes
    tool prompt, read with the hermes parser), passing; under --tool-prompt refuse it is a finding (`!`)."""
    import shutil

    from tests.proxy_helpers import PLAIN_CHATML

    model = tmp_path / "chatml"
    shutil.copytree(tiny_model, model)
    (model / "chat_template.jinja").write_text(PLAIN_CHATML)
    checks = {c["name"]: c for c in json.loads(hrl_doctor("--model", str(model), "--no-probe", "--json").stdout)}
    prompt, parser = checks["tool prompt"], checks["tool parser"]
    assert prompt["ok"] and prompt["figures"] == {"shows_tools": False, "tool_prompt": "hermes"}, prompt
    assert prompt["detail"].startswith("its chat template cannot show tools: the proxy shows them in the hermes tool")
    assert parser["ok"] and parser["detail"].startswith("hermes ("), parser
    human = hrl_doctor("--model", str(model), "--no-probe", "--tool-prompt", "refuse")
    assert "! tool prompt   its chat template cannot show tools: requests with tools get a 400" in human.stdout
    probed = hrl_doctor("--model", str(model), "--engine", "scripted")  # its template names no reasoning format
    assert "✓ reasoning     think (the default: its chat template names no reasoning)" in probed.stdout, probed.stdout
    shown = {c["name"]: c for c in json.loads(hrl_doctor("--model", tiny_model, "--no-probe", "--json").stdout)}
    assert shown["tool prompt"]["ok"] and shown["tool prompt"]["detail"] == "its chat template shows tools"
