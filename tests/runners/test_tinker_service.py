"""`hrl serve --tinker` driven by the official tinker SDK: the server runs as the real CLI on a tiny local model with a
client key of `hrl keys add`; the SDK trains a LoRA with cross_entropy + AdamW until the loss falls, samples from the
saved weights with real logprobs (the trainer's own logprobs of the sampled tokens), and every sample is a trace of
the run directory, token for token; a saved training state loads into a new client. A wrong key is a 401, an unserved base model a 404 naming it, a loss hrl does not
compute a 400."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker  # the `tinker` extra: CI installs it, so this test runs there
from typer.testing import CliRunner

from hrl.cli.main import app
from hrl.runners.rundir import RunDir

types = tinker.types

TEXTS = ["the cat sat on the mat", "hello world, this is a test", "one two three four five", "fix the failing test"]


@pytest.fixture(scope="module")
def served(tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """(base URL, the SDK's api_key, run dir) of `hrl serve --tinker` on the tiny model."""
    run = tmp_path_factory.mktemp("tinker") / "run"
    added = CliRunner().invoke(app, ["keys", "add", "ci", "--run-dir", str(run), "--json"])
    assert added.exit_code == 0, added.output
    api_key = json.loads(added.stdout.strip().splitlines()[-1])["tinker_api_key"]
    log = run.parent / "serve.log"
    cmd = [sys.executable, "-m", "hrl.cli", "serve", "--tinker", "--model", tiny_model, "--port", "0",
           "--run-dir", str(run)]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = None
        for _ in range(900):  # the server prints its URL once the engine is up
            found = re.search(r"Tinker API for .* on (http://\S+)", log.read_text())
            if found or proc.poll() is not None:
                url = found and found.group(1)
                break
            time.sleep(0.2)
        assert url, log.read_text()
        yield url, api_key, run
    finally:
        proc.send_signal(signal.SIGINT)  # stops as Ctrl-C does: exit 0
        try:
            assert proc.wait(timeout=60) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()


def _datum(tokens: list[int]) -> types.Datum:
    """Next-token SFT on the whole text: input tokens[:-1], targets tokens[1:], weight 1 each."""
    n = len(tokens) - 1
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * n})  # fmt: skip


@pytest.mark.slow  # 15-25 s on 2 idle cores (the server's start most of it), up to 55 s on loaded ones
@pytest.mark.timeout(240)
def test_the_sdk_trains_samples_and_is_recorded(
    served: tuple[str, str, Path], tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, api_key, run = served
    monkeypatch.setenv("TINKER_BASE_URL", url)  # how the SDK is pointed at a server: no code change in a script
    monkeypatch.setenv("TINKER_API_KEY", api_key)
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=tiny_model, rank=8).result()
    tok = training.get_tokenizer()  # the served model's own tokenizer (get_info names its folder)
    seqs = [tok.encode(t) for t in TEXTS]
    data = [_datum(s) for s in seqs]
    losses = []
    for _ in range(6):
        fb = training.forward_backward(data, "cross_entropy")
        step = training.optim_step(types.AdamParams(learning_rate=1e-2))
        out = fb.result()
        step.result()
        losses.append(out.metrics["loss:sum"])
        # per datum: one logprob per input token, and the loss is exactly −Σ weights · logprobs
        assert [len(o["logprobs"].tolist()) for o in out.loss_fn_outputs] == [len(s) - 1 for s in seqs]
        total = sum(sum(o["logprobs"].tolist()) for o in out.loss_fn_outputs)
        assert math.isclose(-total, losses[-1], rel_tol=1e-4), (total, losses[-1])
    assert losses[-1] < 0.5 * losses[0] and losses[-1] < min(losses[:-1]), losses
    # the training state round-trips: a client made from it scores as the trained one does
    state = training.save_state("after-6").result().path
    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    ours, theirs = (c.forward(data[:1], "cross_entropy").result() for c in (training, resumed))
    assert theirs.loss_fn_outputs[0]["logprobs"].tolist() == pytest.approx(ours.loss_fn_outputs[0]["logprobs"].tolist())

    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = tok.encode("the cat")
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=0)
    result = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    assert len(result.sequences) == 2
    for seq in result.sequences:
        assert 1 <= len(seq.tokens) <= 6 and len(seq.logprobs) == len(seq.tokens)
        assert all(math.isfinite(x) and x <= 0 for x in seq.logprobs), seq.logprobs
        # real logprobs: the trained weights, scored by the trainer, give the sampled tokens the same ones
        whole = prompt + seq.tokens
        target = types.Datum(model_input=types.ModelInput.from_ints(whole[:-1]),
                             loss_fn_inputs={"target_tokens": whole[1:], "weights": [1.0] * (len(whole) - 1)})  # fmt: skip
        scored = training.forward([target], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
        assert scored[len(prompt) - 1 :] == pytest.approx(seq.logprobs, abs=2e-3)

    traces = RunDir(run).all_traces()
    assert len(traces) == 2 and {t["agent"]["name"] for t in traces} == {"tinker"}
    recorded = sorted((c["response_ids"], c["response_logprobs"]) for t in traces for c in t["calls"])
    sampled = sorted((list(s.tokens), list(s.logprobs)) for s in result.sequences)
    assert [r[0] for r in recorded] == [s[0] for s in sampled]  # token for token
    assert all(r[1] == pytest.approx(s[1], abs=1e-6) for r, s in zip(recorded, sampled, strict=True))
    assert all(t["calls"][0]["prompt_ids"] == prompt for t in traces)
    service.close("success").result()  # its heartbeat thread stops with the session


@pytest.mark.timeout(120)
def test_a_wrong_key_an_unserved_model_and_an_unknown_loss_are_refused(served: tuple[str, str, Path]) -> None:
    url, api_key, _ = served
    with pytest.raises(tinker.AuthenticationError) as wrong:
        tinker.ServiceClient(base_url=url, api_key="tml-hrlc-not-a-key").create_lora_training_client(
            base_model="anything", rank=8
        ).result()
    assert wrong.value.status_code == 401
    service = tinker.ServiceClient(base_url=url, api_key=api_key)
    try:
        with pytest.raises(tinker.NotFoundError, match="Qwen/Qwen3-8B"):
            service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=8).result()
        info = tinker.RestClient(base_url=url, api_key=api_key).get_server_capabilities().result()
        training = service.create_lora_training_client(base_model=info.supported_models[0].model_name, rank=4).result()
        with pytest.raises(tinker.BadRequestError, match="cispo"):
            training.forward_backward([_datum([1, 2, 3])], "cispo").result()
    finally:  # its session's heartbeat thread would go on knocking at the stopped server for the rest of the run
        service.close("success").result()
