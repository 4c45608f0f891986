"""The chat template shipped with hrl's tiny models: ChatML with Hermes-style `<tool_call>` JSON.

Tools are announced in the system turn as JSON signatures; assistant tool calls are rendered as
`<tool_call>{"name": …, "arguments": …}</tool_call>` blocks; tool results come back as a user turn holding
`<tool_response>` blocks. The template is append-only: rendering a longer conversation never changes the
text of an earlier turn, which is what the recording proxy relies on.
"""

__all__ = ["CHATML_TOOLS_TEMPLATE", "SPECIAL_TOKENS"]

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
]

CHATML_TOOLS_TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set msgs = messages -%}
{%- if msgs and msgs[0].role == 'system' -%}
{%- set system_text = text(msgs[0].content) -%}{%- set msgs = msgs[1:] -%}
{%- else -%}{%- set system_text = 'You are a helpful assistant.' -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system_text -}}
{%- if tools -%}
{{- '\\n\\n# Tools\\n\\nYou may call one or more functions. Their signatures are inside <tools></tools>:\\n<tools>' -}}
{%- for tool in tools -%}{{- '\\n' + ((tool.function if tool.function is defined else tool) | tojson) -}}{%- endfor -%}
{{- '\\n</tools>\\n\\nTo call a function, answer with a JSON object inside <tool_call></tool_call> tags:\\n' -}}
{{- '<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for m in msgs -%}
{%- if m.role == 'tool' -%}
{%- if loop.first or msgs[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}
{%- if loop.last or msgs[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if m.reasoning_content is defined and m.reasoning_content -%}
{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' -}}
{%- endif -%}
{%- if m.content -%}{{- text(m.content) -}}{%- endif -%}
{%- if m.tool_calls is defined and m.tool_calls -%}
{%- for call in m.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- set args = fn.arguments if fn.arguments is string else (fn.arguments | tojson) -%}
{%- if m.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}
{{- '<tool_call>\\n{"name": ' + (fn.name | tojson) + ', "arguments": ' + args + '}\\n</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
