"""`-c` keys are the fields of the components' config models: every field is a key, anything else is refused
naming the nearest key, values are checked against the field's type, and a field added to a model is a key at once."""

from __future__ import annotations

import pytest
from pydantic import Field

from hrl.runners.errors import UsageError
from hrl.runners.proxy.proxy import ProxyConfig
from hrl.runners.recipe_config import apply_overrides, load_recipe_config
from hrl.runners.recipe_keys import check_key
from hrl.runners.rollouts.rollout import RolloutConfig
from hrl.runners.tasks.verifier import TestVerifierConfig


@pytest.mark.parametrize(
    ("section", "model"), [("rollout", RolloutConfig), ("proxy", ProxyConfig), ("verifier", TestVerifierConfig)]
)
def test_every_field_of_a_sections_model_is_a_key(section, model):
    for name, field in model.model_fields.items():
        if not field.is_required():
            check_key(f"{section}.{name}", field.get_default(call_default_factory=True), {})


def test_the_training_sections_come_from_the_loop_and_trainer_models():
    from hrl.train.async_loop import AsyncConfig
    from hrl.train.loop import LoopConfig
    from hrl.train.trainer import TrainerConfig

    for section, model in (("train", LoopConfig), ("trainer", TrainerConfig), ("async", AsyncConfig)):
        for name, field in model.model_fields.items():
            if name not in ("trainer", "distill", "model") and not field.is_required():  # top-level sections
                check_key(f"{section}.{name}", field.get_default(call_default_factory=True), {})
    with pytest.raises(UsageError, match=r"unknown -c key 'train\.trainer'"):  # the top-level trainer section fills it
        check_key("train.trainer", {}, {})
    with pytest.raises(UsageError, match=r"unknown -c key 'trainer\.model'"):  # the run's model is the trainer's
        check_key("trainer.model", "m", {})


def test_a_field_added_to_a_model_is_a_key_at_once(monkeypatch):
    """Keys are read from the typed config itself: a field added to a section's model is a key."""
    import hrl.runners.recipe_keys
    from hrl.config import LoopSettings, RunConfig

    class Wider(LoopSettings):
        device: str = Field("cpu", description="A field another change adds.")

    class WiderRun(RunConfig):
        train: Wider = Field(default_factory=Wider)

    with pytest.raises(UsageError):
        check_key("train.device", "cuda", {})
    monkeypatch.setattr(hrl.runners.recipe_keys, "RunConfig", WiderRun)
    check_key("train.device", "cuda", {})


@pytest.mark.parametrize(
    ("override", "message", "hint"),
    [
        ("train.iteratons=3", "did you mean 'train.iterations'?", "valid keys under train: advantage"),
        ("modle=x", "did you mean 'model'?", "valid keys: async, description"),
        ("engine_options.max_btch=2", "'engine_options.max_batch_size'", "max_model_len"),
        ("train.iterations=many", "bad -c train.iterations='many'", "train.iterations: Training steps"),
        ("proxy.version_policy=x", "Input should be 'mixed' or 'pin'", "proxy.version_policy"),
        ("rollout.agent.x=1", "rollout.agent is a value, not a section", "use -c rollout.agent=VALUE"),
    ],
)
def test_bad_keys_and_values_are_refused_with_the_nearest_key(override, message, hint):
    with pytest.raises(UsageError) as caught:
        apply_overrides(load_recipe_config("demo"), [override])
    assert message in str(caught.value) and hint in (caught.value.hint or ""), (str(caught.value), caught.value.hint)


def test_free_form_dicts_take_any_sub_key_and_the_clis_own_keys_are_known(tmp_path):
    cfg = load_recipe_config("demo")
    out = apply_overrides(cfg, ["rollout.agent_options.anything=1", "async.enabled=true", "verifier.name=tests"])
    assert out["rollout"]["agent_options"]["anything"] == 1
    extra = tmp_path / "more.yaml"
    extra.write_text("trainer:\n  lr: 1.0e-4\n  lrr: 2\n")
    with pytest.raises(UsageError, match=r"'trainer\.lr'"):  # a YAML file's keys are checked too
        apply_overrides(cfg, [str(extra)])


def test_engine_options_are_the_named_engines_config():
    check_key("engine_options.max_loras", 2, {"engine": "vllm"})  # a VLLMEngineConfig field
    with pytest.raises(UsageError, match=r"engine_options\.max_loras"):
        check_key("engine_options.max_loras", 2, {"engine": "embedded"})


def test_engine_options_follow_an_engine_flag():
    cfg = load_recipe_config("demo")  # engine: embedded
    with pytest.raises(UsageError, match="token_delay_s"):
        apply_overrides(cfg, ["engine_options.token_delay_s=0.1"])
    apply_overrides(cfg, ["engine_options.token_delay_s=0.1"], engine="scripted")  # --engine scripted


@pytest.mark.parametrize("name", ["demo", "swe"])
def test_every_key_of_a_bundled_recipe_is_known(name):
    from hrl.runners.recipe_keys import check_overrides

    cfg = load_recipe_config(name)
    check_overrides(list(cfg.items()), cfg)


def _bounded_fields():
    """(key, value just past the bound) for every field with a lower or upper bound, in every section's model."""
    from annotated_types import Ge, Gt, Le

    from hrl.runners.engines.embedded import EmbeddedEngineConfig
    from hrl.runners.engines.scripted import ScriptedEngineConfig
    from hrl.runners.engines.vllm import VLLMEngineConfig
    from hrl.runners.placement import PlacementConfig
    from hrl.runners.tasks.harbor_verifier import HarborVerifierConfig
    from hrl.train.async_loop import AsyncConfig
    from hrl.train.loop import LoopConfig
    from hrl.train.trainer import TrainerConfig

    models = [
        ("train", LoopConfig, {}), ("trainer", TrainerConfig, {}), ("async", AsyncConfig, {}),
        ("rollout", RolloutConfig, {}), ("proxy", ProxyConfig, {}), ("placement", PlacementConfig, {}),
        ("verifier", TestVerifierConfig, {}), ("verifier", HarborVerifierConfig, {"verifier": {"name": "harbor"}}),
        ("engine_options", EmbeddedEngineConfig, {}), ("engine_options", VLLMEngineConfig, {"engine": "vllm"}),
        ("engine_options", ScriptedEngineConfig, {"engine": "scripted"}),
    ]  # fmt: skip
    for section, model, cfg in models:
        for name, field in model.model_fields.items():
            for bound in field.metadata:
                if isinstance(bound, Ge):
                    yield f"{section}.{name}", bound.ge - 1, cfg
                elif isinstance(bound, Gt):
                    yield f"{section}.{name}", bound.gt, cfg
                elif isinstance(bound, Le):
                    yield f"{section}.{name}", bound.le + 1, cfg


def test_every_bounded_field_refuses_a_value_past_its_bound():
    """Counts, sizes, limits and rates that cannot be 0 or negative carry bounds on their model's field, and `-c`
    checks them: one value just past each bound is refused naming the key."""
    tried = list(_bounded_fields())
    assert len(tried) >= 80, len(tried)  # the sections' models together: a field that lost its bound shows here
    for key, value, cfg in tried:
        with pytest.raises(UsageError, match=rf"bad -c {key}="):
            check_key(key, value, cfg)


def test_a_recipe_file_is_checked_as_c_is(tmp_path):
    """A misspelt key at the top or nested, or a value past a bound, in a recipe file is refused naming the key, the
    nearest valid one and the file; before, it was ignored and the run took the default."""
    from hrl.recipes.loader import recipe_path

    text = recipe_path("demo").read_text()
    for wrong, message in [
        (text.replace("\ntrain:", "\ntrainr:"), r"unknown recipe key 'trainr' .*did you mean 'trainer' or 'train'"),
        (text.replace("  group_size: 8", "  group_sise: 8"), r"unknown recipe key 'train\.group_sise' in .*"
         r"recipe\.yaml; did you mean 'train\.group_size'"),
        (text.replace("  group_size: 8", "  group_size: 0"), r"bad recipe train\.group_size=0 in .*recipe\.yaml"),
    ]:  # fmt: skip
        (tmp_path / "recipe.yaml").write_text(wrong)
        with pytest.raises(UsageError, match=message):
            load_recipe_config(str(tmp_path))


def _section_models():
    """(section, model, cfg naming its engine or verifier) for every section a recipe can hold."""
    from hrl.config import AsyncConfig, LoopConfig, TrainerConfig
    from hrl.runners.engines.embedded import EmbeddedEngineConfig
    from hrl.runners.engines.remote import RemoteEngineConfig
    from hrl.runners.engines.scripted import ScriptedEngineConfig
    from hrl.runners.engines.vllm import VLLMEngineConfig
    from hrl.runners.online.sessions import OnlineConfig
    from hrl.runners.placement import PlacementConfig
    from hrl.runners.tasks.harbor_verifier import HarborVerifierConfig
    from hrl.runners.tasks.miniwob import MiniWoBVerifierConfig
    from hrl.runners.telemetry.otlp import TelemetryConfig

    return [
        ("train", LoopConfig, {}), ("trainer", TrainerConfig, {}), ("async", AsyncConfig, {}),
        ("rollout", RolloutConfig, {}), ("proxy", ProxyConfig, {}), ("placement", PlacementConfig, {}),
        ("online", OnlineConfig, {}), ("telemetry", TelemetryConfig, {}), ("verifier", TestVerifierConfig, {}),
        ("verifier", HarborVerifierConfig, {"verifier": {"name": "harbor"}}),
        ("verifier", MiniWoBVerifierConfig, {"verifier": {"name": "miniwob"}}),
        ("engine_options", EmbeddedEngineConfig, {}), ("engine_options", VLLMEngineConfig, {"engine": "vllm"}),
        ("engine_options", ScriptedEngineConfig, {"engine": "scripted"}),
        ("engine_options", RemoteEngineConfig, {"engine": "http://127.0.0.1:1"}),
    ]  # fmt: skip


def test_a_bounded_number_refuses_inf_and_nan():
    """`gt=0` lets inf through, and nan compares false with every bound: each bounded float field of every section
    refuses them (as YAML spells them, and as text), naming the key. Before, `-c trainer.lr=inf` started a run."""
    from annotated_types import Ge, Gt, Le, Lt

    tried = 0
    for section, model, cfg in _section_models():
        for name, field in model.model_fields.items():
            if field.annotation is float and any(isinstance(m, Gt | Ge | Lt | Le) for m in field.metadata):
                for value in (float("inf"), float("-inf"), float("nan"), "inf", "nan"):
                    with pytest.raises(
                        UsageError, match=rf"bad -c {section}\.{name}=.*: Input should be a finite number"
                    ):
                        check_key(f"{section}.{name}", value, cfg)
                tried += 1
    assert tried >= 30, tried  # lr, clip_low, time_budget_s, timeouts, …: a field that lost its bound shows here


def test_the_section_models_refuse_inf_and_nan_themselves():
    """A config built in Python (not through `-c`) refuses a non-finite number in any float field too."""
    from pydantic import ValidationError

    from hrl.config import TrainerConfig
    from hrl.runners.placement import RunConfig

    required = {"TrainerConfig": {"model": "m"}, "LoopConfig": {"trainer": TrainerConfig(model="m")}}
    mine = [(model, cfg) for section, model, cfg in _section_models() if section not in ("proxy", "online")]
    for model, _ in [*mine, (RunConfig, {})]:
        for name, field in model.model_fields.items():
            if field.annotation is float:
                with pytest.raises(ValidationError, match="finite number"):
                    model(**required.get(model.__name__, {}), **{name: float("inf")})


def test_a_refused_value_imports_no_torch(tmp_path):
    """`hrl train -c trainer.lr=inf` is refused (exit 2) before any run directory, and saying so imports no torch:
    the config's models live in hrl.config, which imports nothing heavy."""
    import subprocess
    import sys

    probe = (
        "import sys\nfrom hrl.cli.main import run\n"
        "sys.argv = ['hrl', 'train', '--recipe', 'demo', '-c', sys.argv[1], '--run-dir', 'r']\ncode = run()\n"
        "print('CODE', code, 'TORCH', 'torch' in sys.modules)"
    )
    for value in ("inf", "-inf", "nan"):
        out = subprocess.run([sys.executable, "-c", probe, f"trainer.lr={value}"], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path)  # fmt: skip
        assert "CODE 2 TORCH False" in out.stdout, (value, out.stdout, out.stderr)
        assert f"bad -c trainer.lr='{value}'" in out.stderr, out.stderr
        assert not list(tmp_path.iterdir()), list(tmp_path.iterdir())
