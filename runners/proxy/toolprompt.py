"""The tool prompt: how a request's tools reach a model whose chat template cannot show them (`proxy.tool_prompt`).

A template shows tools when a conversation rendered with a probe tool holds its name (`template_shows_tools`). Where
it does not, `hermes` (and `auto`) shows them in the Hermes tool prompt in the system message and the replies are
read with the hermes parser (`hermes_tool_messages`); `refuse` answers 400 (`ToolsRefusedError`). Nothing here
stands a server up: the CLI checks names and models with it before anything starts.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["TOOL_PROMPTS", "ToolsRefusedError", "hermes_tool_messages", "model_shows_tools", "template_shows_tools",
           "tool_prompt_note"]  # fmt: skip


class ToolsRefusedError(ValueError):
    """A request with tools for a model whose chat template cannot show them, under `proxy.tool_prompt: refuse`
    (`ChatTemplate.injected_tool_prompt`): a 400 in the dialect's shape, saying so."""


# proxy.tool_prompt: what the proxy does with a request's tools when the chat template cannot show them (see
# `template_shows_tools`). hermes (and auto, which is hermes): the tools go into the system message in the Hermes
# tool prompt (`hermes_tool_messages`) and replies are read with the hermes parser; refuse: a 400 (ToolsRefusedError).
TOOL_PROMPTS = ("auto", "hermes", "refuse")

# a tool no template knows: a template shows tools when this one's name is in what it renders of it
_PROBE_NAME = "hrl_probe_tool_q7zx"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": _PROBE_NAME,
        "description": "hrl checks that the chat template shows the tools it is given",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}
_PROBES = (
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
)
_shows_tools: dict[str, bool] = {}  # by chat template text


def template_shows_tools(tokenizer: Any) -> bool:
    """Whether `tokenizer`'s chat template shows the tools a request gives it: a conversation rendered with a probe
    tool holds the probe's name, and rendered without it does not (with and without a system message: a template
    that shows tools only beside a system message would drop the others'). A template that renders neither
    conversation is taken to show them (nothing to learn). Cached per template text."""
    key = str(tokenizer.chat_template)
    if key in _shows_tools:
        return _shows_tools[key]
    seen: list[bool] = []
    for messages in _PROBES:
        try:
            bare = str(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        except Exception:  # a template that cannot render this conversation (no system role): the other decides
            continue
        try:
            shown = str(tokenizer.apply_chat_template(messages, tools=[_PROBE_TOOL], add_generation_prompt=True,
                                                      tokenize=False))  # fmt: skip
        except Exception:  # it renders the conversation, but not with tools
            shown = ""
        seen.append(_PROBE_NAME in shown and _PROBE_NAME not in bare)
    _shows_tools[key] = result = all(seen)
    return result


def model_shows_tools(model_path: str) -> bool:
    """`template_shows_tools` for a model dir (or an HF id in the local cache), without a ChatTemplate: its tokenizer
    only. True for a tokenizer without a chat template (the proxy refuses to serve it for another reason)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    return template_shows_tools(tok) if tok.chat_template else True


def tool_prompt_note(shows_tools: bool, tool_prompt: str) -> str:
    """What the proxy does with a request's tools, in words (`hrl serve`, `hrl doctor --model`)."""
    if shows_tools:
        return "its chat template shows tools"
    if tool_prompt == "refuse":
        return "its chat template cannot show tools: requests with tools get a 400 (proxy.tool_prompt refuse)"
    return (f"its chat template cannot show tools: the proxy shows them in the hermes tool prompt (proxy.tool_prompt "
            f"{tool_prompt}) and reads calls with the hermes parser")  # fmt: skip


# The Hermes tool prompt (Qwen2.5's words): what `proxy.tool_prompt: hermes` adds to the system message
_HERMES_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
    "signatures within <tools></tools> XML tags:\n<tools>"
)
_HERMES_TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call>"
)


def hermes_tool_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`messages` with `tools` shown in the Hermes tool prompt, for a template that cannot show tools itself: the
    tool prompt (`# Tools`, one JSON schema a line inside `<tools></tools>`, how to call one) ends the first system
    message (a system message of its own when there is none); an assistant's tool calls become its text, each a
    `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` block; a run of tool results becomes one user message
    of `<tool_response>\n…\n</tool_response>` blocks. Append-only, like the conversation: a longer conversation
    renders the earlier messages as before."""
    block = _HERMES_TOOLS_HEAD + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + _HERMES_TOOLS_TAIL
    out: list[dict[str, Any]] = []
    if messages and messages[0].get("role") == "system":
        system = _text(messages[0].get("content"))
        out.append({**messages[0], "content": f"{system}\n\n{block}" if system else block})
        messages = messages[1:]
    else:
        out.append({"role": "system", "content": block})
    after_tool = False  # the last message out is the user message of tool results: the next result joins it
    for m in messages:
        if m.get("role") == "tool":
            response = f"<tool_response>\n{_text(m.get('content'))}\n</tool_response>"
            if after_tool:
                out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{response}"}
            else:
                out.append({"role": "user", "content": response})
            after_tool = True
            continue
        after_tool = False
        if m.get("role") == "assistant" and m.get("tool_calls"):
            text = _text(m.get("content"))
            for call in m["tool_calls"]:
                fn = call.get("function") if isinstance(call.get("function"), dict) else call
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = json.loads(args)
                    except ValueError:
                        pass  # not JSON: shown as the string it is
                body = json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)
                text += ("\n" if text else "") + f"<tool_call>\n{body}\n</tool_call>"
            out.append({k: v for k, v in m.items() if k != "tool_calls"} | {"content": text})
        else:
            out.append(m)
    return out


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: their text parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return "" if content is None else str(content)
