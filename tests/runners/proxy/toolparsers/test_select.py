"""`auto` picks the family from a model directory's chat template and config.json; names are checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hrl.runners.errors import UnknownNameError
from hrl.runners.proxy.proxy import ProxyConfig
from hrl.runners.proxy.toolparsers import check_name, detect, detect_model
from tests.proxy_helpers import PLAIN_CHATML

TEMPLATES = {
    "hermes": '{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>\n{"name": ...}\n</tool_call>',
    "qwen3-coder": "<tool_call>\n<function={{ tc.name }}>\n<parameter={{ k }}>\n{{ v }}\n</parameter>\n</function>",
    "glm45": "<tool_call>{{ tc.name }}<arg_key>{{ k }}</arg_key><arg_value>{{ v }}</arg_value></tool_call>",
    "llama3": "{{- '<|python_tag|>' + tool_call.name }}<|eom_id|>",
    "mistral": "{{- '[TOOL_CALLS]' + tool_calls | tojson }}",
    "deepseek-v3": "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'}}",
    "kimi-k2": "<|tool_calls_section_begin|>{% for tc in tool_calls %}<|tool_call_begin|>{% endfor %}",
    "gpt-oss": "<|start|>assistant<|channel|>commentary to=functions.x <|constrain|>json<|message|>",
}


def model_dir(tmp: Path, template: str | None, config: dict | None, jinja: bool = False) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    if template is not None:
        if jinja:
            (tmp / "chat_template.jinja").write_text(template)
        else:
            (tmp / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    if config is not None:
        (tmp / "config.json").write_text(json.dumps(config))
    return tmp


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_auto_from_the_chat_template(tmp_path: Path, family: str) -> None:
    assert detect_model(str(model_dir(tmp_path / "a", TEMPLATES[family], {"model_type": "qwen2"}))) == family
    assert detect_model(str(model_dir(tmp_path / "b", TEMPLATES[family], None, jinja=True))) == family


@pytest.mark.parametrize(
    ("config", "family"),
    [
        ({"model_type": "gpt_oss"}, "gpt-oss"),
        ({"model_type": "deepseek_v3"}, "deepseek-v3"),
        ({"model_type": "kimi_k2"}, "kimi-k2"),
        ({"model_type": "glm4_moe"}, "glm45"),
        ({"model_type": "mistral"}, "mistral"),
        ({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}, "llama3"),
        ({"architectures": ["DeepseekV3ForCausalLM"]}, "deepseek-v3"),
        ({"model_type": "qwen2"}, "hermes"),
        ({}, "hermes"),
    ],
)
def test_auto_from_config_when_the_template_says_nothing(tmp_path: Path, config: dict, family: str) -> None:
    assert detect_model(str(model_dir(tmp_path, "{{ messages }}", config))) == family


def test_template_markers_win_over_the_config() -> None:
    """A Llama-architecture model fine-tuned on Hermes calls (its template says so) gets the Hermes parser."""
    assert detect(TEMPLATES["hermes"], {"model_type": "llama"}) == "hermes"


def test_a_chatml_template_is_hermes_whatever_the_model_type() -> None:
    """SmolLM2 is a `llama` whose template is plain ChatML: llama3 (from the model_type) would read no call of a model
    that writes ChatML; the model_type's family stays for a template in its own format, or none."""
    llama = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    assert detect(PLAIN_CHATML, llama) == "hermes"
    assert detect(PLAIN_CHATML, {"model_type": "mistral"}) == "hermes"  # OpenHermes-2.5-Mistral: ChatML
    assert detect("<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>", llama) == "llama3"
    assert detect("", llama) == "llama3"


def test_the_smollm2_model_dir_is_hermes(tmp_path: Path) -> None:
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    assert detect_model(str(model_dir(tmp_path, PLAIN_CHATML, config, jinja=True))) == "hermes"


def test_the_tiny_test_model_is_hermes(tiny_model: str) -> None:
    """The model the golden trace and the proxy tests run on keeps the Hermes parser."""
    from hrl.runners.proxy.template import ChatTemplate

    assert detect_model(tiny_model) == "hermes"
    assert ChatTemplate(tiny_model).tool_parser.name == "hermes"


def test_unknown_name_names_the_nearest() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'qwen3-coder'"):
        check_name("qwen3_coder")
    with pytest.raises(UnknownNameError, match="tool parser 'harmony'"):  # before a run starts (check_run)
        check_name("harmony")
    assert ProxyConfig().tool_parser == "auto" and check_name("kimi-k2") == "kimi-k2"
