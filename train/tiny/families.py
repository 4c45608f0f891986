"""The model families a tiny model can be built as (`hrl models tiny DIR --family NAME`): each family's chat template,
special tokens and stop tokens.

Each template is written here to reproduce its family's published prompt format token for token (role markers,
tool declarations, tool-call syntax, tool results, thinking blocks, and which earlier reasoning the family drops
from the history); the format is the family's, the template text is ours. Conventions shared by all of them: tool
call `arguments` arrive as a mapping (the proxy parses JSON strings first, as vLLM does; a string is used as is),
and message content may be a string or a list of text parts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hrl.train.tiny.chatml import CHATML_TOOLS_TEMPLATE, SPECIAL_TOKENS

__all__ = ["FAMILIES", "Family", "family_spec"]


@dataclass(frozen=True)
class Family:
    """How a family's tokenizer looks: its template, its special tokens (first: padding), the token it names as
    end of sequence, the tokens generation stops at (generation_config.json), and its begin-of-sequence token."""

    name: str
    template: str
    special_tokens: tuple[str, ...]
    eos: str
    stops: tuple[str, ...]
    bos: str | None = None

    @property
    def pad(self) -> str:
        return self.special_tokens[0]


def _tokens(names: str) -> tuple[str, ...]:
    return tuple(names.split())


# ---- pieces every template uses ---------------------------------------------------------------------------
_TEXT = """\
{%- macro text(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable and content is not mapping -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{- part.text -}}{%- endif -%}{%- endfor -%}
{%- elif content is not none -%}{{- content | string -}}
{%- endif -%}
{%- endmacro -%}
{%- macro as_json(value) -%}{%- if value is string -%}{{- value -}}{%- else -%}{{- value | tojson -}}{%- endif -%}{%- endmacro -%}
{%- macro plain(value) -%}{%- if value is string -%}{{- value -}}{%- elif value is mapping or value is iterable -%}{{- value | tojson -}}{%- else -%}{{- value | string -}}{%- endif -%}{%- endmacro -%}
{%- macro thought(m) -%}{%- if m.reasoning_content is defined and m.reasoning_content is string -%}{{- m.reasoning_content -}}{%- elif m.thinking is defined and m.thinking is string -%}{{- m.thinking -}}{%- endif -%}{%- endmacro -%}
"""

# ---- Qwen3-Coder: ChatML, XML function calls, tool results as user turns ----------------------------------------
_QWEN3_CODER = (
    _TEXT
    + """\
{%- macro extra(d, handled) -%}
{%- if d is mapping -%}{%- for k, v in d.items() -%}{%- if k not in handled -%}
{{- '\\n<' ~ k ~ '>' ~ plain(v) ~ '</' ~ k ~ '>' -}}
{%- endif -%}{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set msgs = messages -%}
{%- if msgs and msgs[0].role == 'system' -%}{%- set system_text = text(msgs[0].content) -%}{%- set msgs = msgs[1:] -%}
{%- elif tools -%}{%- set system_text = 'You are Qwen, a helpful AI assistant that can interact with a computer to solve tasks.' -%}
{%- else -%}{%- set system_text = none -%}
{%- endif -%}
{%- if system_text is not none -%}{{- '<|im_start|>system\\n' + system_text -}}{%- endif -%}
{%- if tools -%}
{{- '\\n\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' -}}
{%- for tool in tools -%}
{%- set fn = tool.function if tool.function is defined else tool -%}
{{- '\\n<function>\\n<name>' ~ fn.name ~ '</name>' -}}
{%- if fn.description is defined and fn.description -%}{{- '\\n<description>' ~ (fn.description | trim) ~ '</description>' -}}{%- endif -%}
{{- '\\n<parameters>' -}}
{%- set params = fn.parameters if fn.parameters is defined and fn.parameters is mapping else {} -%}
{%- if params.properties is defined and params.properties is mapping -%}
{%- for pname, pfields in params.properties.items() -%}
{{- '\\n<parameter>\\n<name>' ~ pname ~ '</name>' -}}
{%- if pfields.type is defined -%}{{- '\\n<type>' ~ (pfields.type | string) ~ '</type>' -}}{%- endif -%}
{%- if pfields.description is defined -%}{{- '\\n<description>' ~ (pfields.description | trim) ~ '</description>' -}}{%- endif -%}
{{- extra(pfields, ['name', 'type', 'description']) -}}
{{- '\\n</parameter>' -}}
{%- endfor -%}
{%- endif -%}
{{- extra(params, ['type', 'properties']) -}}
{{- '\\n</parameters>' -}}
{{- extra(fn, ['type', 'name', 'description', 'parameters']) -}}
{{- '\\n</function>' -}}
{%- endfor -%}
{{- '\\n</tools>' -}}
{{- '\\n\\nIf you choose to call a function ONLY reply in the following format with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n<parameter=example_parameter_2>\\nThis is the value for the second parameter\\nthat can span\\nmultiple lines\\n</parameter>\\n</function>\\n</tool_call>\\n\\n<IMPORTANT>\\nReminder:\\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\\n- Required parameters MUST be specified\\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\\n</IMPORTANT>' -}}
{%- endif -%}
{%- if system_text is not none -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- for m in msgs -%}
{%- if m.role == 'assistant' and m.tool_calls is defined and m.tool_calls -%}
{{- '<|im_start|>assistant' -}}
{%- set content = text(m.content) -%}
{%- if content | trim -%}{{- '\\n' + (content | trim) + '\\n' -}}{%- endif -%}
{%- for call in m.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{{- '\\n<tool_call>\\n<function=' + fn.name + '>\\n' -}}
{%- if fn.arguments is mapping -%}{%- for k, v in fn.arguments.items() -%}
{{- '<parameter=' + k + '>\\n' + plain(v) + '\\n</parameter>\\n' -}}
{%- endfor -%}{%- endif -%}
{{- '</function>\\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\\n' -}}
{%- elif m.role == 'tool' -%}
{%- if loop.first or msgs[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user\\n' -}}{%- endif -%}
{{- '<tool_response>\\n' + text(m.content) + '\\n</tool_response>\\n' -}}
{%- if loop.last or msgs[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + m.role + '\\n' + text(m.content) + '<|im_end|>\\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""
)

# ---- GLM-4.5: role tokens, <arg_key>/<arg_value> calls, reasoning kept only after the last user turn -------------
_GLM45 = (
    _TEXT
    + """\
{{- '[gMASK]<sop>' -}}
{%- if tools -%}
{{- '<|system|>\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\\n' -}}
{%- for tool in tools -%}{{- (tool | tojson) + '\\n' -}}{%- endfor -%}
{{- '</tools>\\n\\nFor each function call, output the function name and arguments within the following XML format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}</arg_key>\\n<arg_value>{arg-value-1}</arg_value>\\n<arg_key>{arg-key-2}</arg_key>\\n<arg_value>{arg-value-2}</arg_value>\\n...\\n</tool_call>' -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}
{%- set said = text(m.content) -%}
{{- '<|user|>\\n' + said -}}
{%- if enable_thinking is defined and not enable_thinking and not said.endswith('/nothink') -%}{{- '/nothink' -}}{%- endif -%}
{%- elif m.role == 'system' -%}{{- '<|system|>\\n' + text(m.content) -}}
{%- elif m.role == 'assistant' -%}
{%- set content = text(m.content) -%}
{%- set reasoning = thought(m) -%}
{%- if not reasoning and '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{{- '<|assistant|>' -}}
{%- if loop.index0 > ns.last_user and reasoning -%}{{- '\\n<think>' + (reasoning | trim) + '</think>' -}}
{%- else -%}{{- '\\n<think></think>' -}}
{%- endif -%}
{%- if content | trim -%}{{- '\\n' + (content | trim) -}}{%- endif -%}
{%- for call in m.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{{- '\\n<tool_call>' + fn.name + '\\n' -}}
{%- if fn.arguments is mapping -%}{%- for k, v in fn.arguments.items() -%}
{{- '<arg_key>' + k + '</arg_key>\\n<arg_value>' + as_json(v) + '</arg_value>\\n' -}}
{%- endfor -%}{%- endif -%}
{{- '</tool_call>' -}}
{%- endfor -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
{{- '\\n<tool_response>\\n' + text(m.content) + '\\n</tool_response>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|assistant|>' -}}{%- if enable_thinking is defined and not enable_thinking -%}{{- '\\n<think></think>' -}}{%- endif -%}{%- endif -%}
"""
)

# ---- Llama 3.1: header ids, JSON calls, tools in the first user turn, results from `ipython` as JSON -------------
_LLAMA3 = (
    _TEXT
    + """\
{{- bos_token -}}
{%- set msgs = messages -%}
{%- if msgs and msgs[0].role == 'system' -%}{%- set system_text = text(msgs[0].content) | trim -%}{%- set msgs = msgs[1:] -%}
{%- else -%}{%- set system_text = '' -%}
{%- endif -%}
{%- if date_string is not defined -%}{%- set date_string = '26 Jul 2024' -%}{%- endif -%}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}
{%- if builtin_tools is defined or tools -%}{{- 'Environment: ipython\\n' -}}{%- endif -%}
{%- if builtin_tools is defined -%}{{- 'Tools: ' + (builtin_tools | reject('equalto', 'code_interpreter') | join(', ')) + '\\n\\n' -}}{%- endif -%}
{{- 'Cutting Knowledge Date: December 2023\\nToday Date: ' + date_string + '\\n\\n' -}}
{{- system_text + '<|eot_id|>' -}}
{%- if tools -%}
{%- if not msgs or msgs[0].role != 'user' -%}{{- raise_exception('Cannot put tools in the first user message when there is none.') -}}{%- endif -%}
{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
{{- 'Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\\n\\n' -}}
{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.Do not use variables.\\n\\n' -}}
{%- for tool in tools -%}{{- (tool | tojson(indent=4)) + '\\n\\n' -}}{%- endfor -%}
{{- (text(msgs[0].content) | trim) + '<|eot_id|>' -}}
{%- set msgs = msgs[1:] -%}
{%- endif -%}
{%- for m in msgs -%}
{%- if m.role == 'assistant' and m.tool_calls is defined and m.tool_calls -%}
{%- if m.tool_calls | length != 1 -%}{{- raise_exception('This model only supports single tool-calls at once!') -}}{%- endif -%}
{%- set fn = m.tool_calls[0].function if m.tool_calls[0].function is defined else m.tool_calls[0] -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
{%- if builtin_tools is defined and fn.name in builtin_tools -%}
{{- '<|python_tag|>' + fn.name + '.call(' -}}
{%- for k, v in fn.arguments.items() -%}{{- k + '="' + v + '"' -}}{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}{%- endfor -%}
{{- ')<|eom_id|>' -}}
{%- else -%}
{{- '{"name": "' + fn.name + '", "parameters": ' + (fn.arguments | tojson) + '}<|eot_id|>' -}}
{%- endif -%}
{%- elif m.role == 'tool' or m.role == 'ipython' -%}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' -}}
{%- if m.content is mapping or m.content is iterable -%}{{- m.content | tojson -}}{%- else -%}{{- m.content | string -}}{%- endif -%}
{{- '<|eot_id|>' -}}
{%- else -%}
{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + (text(m.content) | trim) + '<|eot_id|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}
"""
)

# ---- Mistral (v11 tokenizers: Devstral, Mistral Small 3.x): [INST], tools before the last user turn ------------
_MISTRAL = (
    _TEXT
    + """\
{{- bos_token -}}
{%- set msgs = messages -%}
{%- if msgs and msgs[0].role == 'system' -%}
{{- '[SYSTEM_PROMPT]' + text(msgs[0].content) + '[/SYSTEM_PROMPT]' -}}
{%- set msgs = msgs[1:] -%}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in msgs -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in msgs -%}
{%- if m.role == 'user' -%}
{%- if tools and loop.index0 == ns.last_user -%}
{{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}
{%- endif -%}
{{- '[INST]' + text(m.content) + '[/INST]' -}}
{%- elif m.role == 'system' -%}
{{- '[SYSTEM_PROMPT]' + text(m.content) + '[/SYSTEM_PROMPT]' -}}
{%- elif m.role == 'assistant' -%}
{{- text(m.content) -}}
{%- for call in m.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{{- '[TOOL_CALLS]' + fn.name + '[ARGS]' + as_json(fn.arguments) -}}
{%- endfor -%}
{{- eos_token -}}
{%- elif m.role == 'tool' -%}
{{- '[TOOL_RESULTS]' + text(m.content) + '[/TOOL_RESULTS]' -}}
{%- endif -%}
{%- endfor -%}
"""
)

# ---- DeepSeek-V3.1: fullwidth role tokens, call sections, non-thinking by default, reasoning never replayed --------
_DEEPSEEK_V3 = (
    _TEXT
    + """\
{%- set ns = namespace(system='', is_tool=false, is_last_user=false, first=true) -%}
{%- for m in messages -%}{%- if m.role == 'system' -%}
{%- set ns.system = (ns.system + '\\n\\n' if not ns.first else '') + text(m.content) -%}{%- set ns.first = false -%}
{%- endif -%}{%- endfor -%}
{%- if tools -%}
{%- set tool_ns = namespace(text='## Tools\\nYou have access to the following tools:\\n') -%}
{%- for tool in tools -%}
{%- set fn = tool.function if tool.function is defined else tool -%}
{%- set tool_ns.text = tool_ns.text + '\\n### ' + fn.name + '\\nDescription: ' + (fn.description or '') + '\\n\\nParameters: ' + (fn.parameters | tojson) + '\\n' -%}
{%- endfor -%}
{%- set tool_ns.text = tool_ns.text + '\\nIMPORTANT: ALWAYS adhere to this exact format for tool use:\\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>\\n\\nWhere:\\n\\n- `tool_call_name` must be an exact match to one of the available tools\\n- `tool_call_arguments` must be valid JSON that strictly follows the tool\\'s Parameters Schema\\n- For multiple tool calls, chain them directly without separators or spaces\\n' -%}
{%- set ns.system = ns.system + '\\n\\n' + tool_ns.text -%}
{%- endif -%}
{{- bos_token + ns.system -}}
{%- for m in messages -%}
{%- if m.role == 'user' -%}
{%- set ns.is_tool = false -%}{%- set ns.is_last_user = true -%}
{{- '<｜User｜>' + text(m.content) -}}
{%- elif m.role == 'assistant' -%}
{%- if ns.is_last_user -%}{{- '<｜Assistant｜></think>' -}}{%- endif -%}
{%- set ns.is_last_user = false -%}{%- set ns.is_tool = false -%}
{%- set content = text(m.content) -%}
{%- if '</think>' in content -%}{%- set content = content.split('</think>', 1)[1] -%}{%- endif -%}
{{- content -}}
{%- if m.tool_calls is defined and m.tool_calls -%}
{{- '<｜tool▁calls▁begin｜>' -}}
{%- for call in m.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{{- '<｜tool▁call▁begin｜>' + fn.name + '<｜tool▁sep｜>' + as_json(fn.arguments) + '<｜tool▁call▁end｜>' -}}
{%- endfor -%}
{{- '<｜tool▁calls▁end｜>' -}}
{%- endif -%}
{{- '<｜end▁of▁sentence｜>' -}}
{%- elif m.role == 'tool' -%}
{%- set ns.is_last_user = false -%}{%- set ns.is_tool = true -%}
{{- '<｜tool▁output▁begin｜>' + text(m.content) + '<｜tool▁output▁end｜>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt and ns.is_last_user and not ns.is_tool -%}
{{- '<｜Assistant｜>' -}}{%- if thinking is defined and thinking -%}{{- '<think>' -}}{%- else -%}{{- '</think>' -}}{%- endif -%}
{%- endif -%}
"""
)

# ---- Kimi-K2: <|im_…|> role tokens with names, tools declared as JSON, results headed by the call id --------------
_KIMI_K2 = (
    _TEXT
    + """\
{%- if tools -%}{{- '<|im_system|>tool_declare<|im_middle|>' + (tools | tojson) + '<|im_end|>' -}}{%- endif -%}
{%- if not messages or messages[0].role != 'system' -%}
{{- '<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>' -}}
{%- endif -%}
{%- for m in messages -%}
{%- set name = m.name if m.name is defined and m.name else m.role -%}
{%- if m.role == 'user' -%}{{- '<|im_user|>' + name + '<|im_middle|>' -}}
{%- elif m.role == 'assistant' -%}{{- '<|im_assistant|>' + name + '<|im_middle|>' -}}
{%- else -%}{{- '<|im_system|>' + name + '<|im_middle|>' -}}
{%- endif -%}
{%- if m.role == 'assistant' and m.tool_calls is defined and m.tool_calls -%}
{{- text(m.content) -}}
{{- '<|tool_calls_section_begin|>' -}}
{%- for call in m.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{{- '<|tool_call_begin|>' + (call.id if call.id is defined and call.id else 'functions.' + fn.name + ':' + (loop.index0 | string)) + '<|tool_call_argument_begin|>' + as_json(fn.arguments) + '<|tool_call_end|>' -}}
{%- endfor -%}
{{- '<|tool_calls_section_end|>' -}}
{%- elif m.role == 'tool' -%}
{{- '## Return of ' + (m.tool_call_id or '') + '\\n' + text(m.content) -}}
{%- else -%}
{{- text(m.content) -}}
{%- endif -%}
{{- '<|im_end|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_assistant|>assistant<|im_middle|>' -}}{%- endif -%}
"""
)

# ---- gpt-oss (Harmony): channels; analysis dropped once a final answer follows; `<|return|>` only when training ----
_GPT_OSS = (
    _TEXT
    + """\
{%- macro ts_type(p) -%}
{%- if p.enum is defined -%}{%- for v in p.enum -%}{{- v | tojson -}}{%- if not loop.last -%}{{- ' | ' -}}{%- endif -%}{%- endfor -%}
{%- elif p.type is defined and p.type == 'string' -%}{{- 'string' -}}
{%- elif p.type is defined and (p.type == 'number' or p.type == 'integer') -%}{{- 'number' -}}
{%- elif p.type is defined and p.type == 'boolean' -%}{{- 'boolean' -}}
{%- elif p.type is defined and p.type == 'array' -%}{{- (ts_type(p['items']) if p['items'] is defined else 'any') + '[]' -}}
{%- elif p.type is defined and p.type == 'object' -%}{{- 'object' -}}
{%- else -%}{{- 'any' -}}
{%- endif -%}
{%- endmacro -%}
{%- set msgs = messages -%}
{%- set developer = '' -%}
{%- if msgs and (msgs[0].role == 'system' or msgs[0].role == 'developer') -%}{%- set developer = text(msgs[0].content) -%}{%- set msgs = msgs[1:] -%}{%- endif -%}
{{- '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\\nKnowledge cutoff: 2024-06\\n' -}}
{{- 'Current date: ' + (strftime_now('%Y-%m-%d') if strftime_now is defined else '2025-08-05') + '\\n\\n' -}}
{{- 'Reasoning: ' + (reasoning_effort if reasoning_effort is defined else 'medium') + '\\n\\n' -}}
{{- '# Valid channels: analysis, commentary, final. Channel must be included for every message.' -}}
{%- if tools -%}{{- "\\nCalls to these tools must go to the commentary channel: 'functions'." -}}{%- endif -%}
{{- '<|end|>' -}}
{%- if developer or tools -%}
{{- '<|start|>developer<|message|>' -}}
{%- if developer -%}{{- '# Instructions\\n\\n' + developer -}}{%- if tools -%}{{- '\\n\\n' -}}{%- endif -%}{%- endif -%}
{%- if tools -%}
{{- '# Tools\\n\\n## functions\\n\\nnamespace functions {\\n\\n' -}}
{%- for tool in tools -%}
{%- set fn = tool.function if tool.function is defined else tool -%}
{%- if fn.description is defined and fn.description -%}{{- '// ' + fn.description + '\\n' -}}{%- endif -%}
{%- set props = fn.parameters.properties if fn.parameters is defined and fn.parameters.properties is defined else {} -%}
{%- if props -%}
{%- set required = fn.parameters.required if fn.parameters.required is defined else [] -%}
{{- 'type ' + fn.name + ' = (_: {\\n' -}}
{%- for pname, p in props.items() -%}
{%- if p.description is defined and p.description -%}{{- '// ' + p.description + '\\n' -}}{%- endif -%}
{{- pname + ('' if pname in required else '?') + ': ' + ts_type(p) + ',\\n' -}}
{%- endfor -%}
{{- '}) => any;\\n\\n' -}}
{%- else -%}
{{- 'type ' + fn.name + ' = () => any;\\n\\n' -}}
{%- endif -%}
{%- endfor -%}
{{- '} // namespace functions' -}}
{%- endif -%}
{{- '<|end|>' -}}
{%- endif -%}
{%- set ns = namespace(last_final=-1, tool_name='') -%}
{%- for m in msgs -%}{%- if m.role == 'assistant' and not (m.tool_calls is defined and m.tool_calls) -%}{%- set ns.last_final = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in msgs -%}
{%- if m.role == 'user' -%}{{- '<|start|>user<|message|>' + text(m.content) + '<|end|>' -}}
{%- elif m.role == 'system' or m.role == 'developer' -%}{{- '<|start|>developer<|message|>' + text(m.content) + '<|end|>' -}}
{%- elif m.role == 'assistant' and m.tool_calls is defined and m.tool_calls -%}
{%- set reasoning = thought(m) or text(m.content) -%}
{%- if reasoning and loop.index0 > ns.last_final -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + reasoning + '<|end|>' -}}{%- endif -%}
{%- for call in m.tool_calls -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- set ns.tool_name = fn.name -%}
{{- '<|start|>assistant to=functions.' + fn.name + '<|channel|>commentary json<|message|>' + (fn.arguments | tojson) + '<|call|>' -}}
{%- endfor -%}
{%- elif m.role == 'assistant' -%}
{%- if loop.last and not add_generation_prompt -%}
{%- if thought(m) -%}{{- '<|start|>assistant<|channel|>analysis<|message|>' + thought(m) + '<|end|>' -}}{%- endif -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + text(m.content) + '<|return|>' -}}
{%- else -%}
{{- '<|start|>assistant<|channel|>final<|message|>' + text(m.content) + '<|end|>' -}}
{%- endif -%}
{%- elif m.role == 'tool' -%}
{{- '<|start|>functions.' + ns.tool_name + ' to=assistant<|channel|>commentary<|message|>' + text(m.content) + '<|end|>' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start|>assistant' -}}{%- endif -%}
"""
)

FAMILIES: dict[str, Family] = {
    "hermes": Family("hermes", CHATML_TOOLS_TEMPLATE, tuple(SPECIAL_TOKENS), "<|im_end|>", _tokens("<|im_end|>")),
    "qwen3-coder": Family(
        "qwen3-coder",
        _QWEN3_CODER,
        _tokens("<|endoftext|> <|im_start|> <|im_end|> <tool_call> </tool_call> <tool_response> </tool_response>"),
        "<|im_end|>",
        _tokens("<|im_end|> <|endoftext|>"),
    ),
    "glm45": Family(
        "glm45",
        _GLM45,
        _tokens(
            "<|endoftext|> [gMASK] <sop> <|system|> <|user|> <|assistant|> <|observation|> <think> </think> <tool_call> </tool_call> <arg_key> </arg_key> <arg_value> </arg_value> <tool_response> </tool_response>"
        ),
        "<|endoftext|>",
        _tokens("<|endoftext|> <|user|> <|observation|>"),
    ),
    "llama3": Family(
        "llama3",
        _LLAMA3,
        _tokens(
            "<|finetune_right_pad_id|> <|begin_of_text|> <|end_of_text|> <|start_header_id|> <|end_header_id|> <|eot_id|> <|eom_id|> <|python_tag|>"
        ),
        "<|eot_id|>",
        _tokens("<|end_of_text|> <|eom_id|> <|eot_id|>"),
        bos="<|begin_of_text|>",
    ),
    "mistral": Family(
        "mistral",
        _MISTRAL,
        _tokens(
            "<pad> <s> </s> [INST] [/INST] [AVAILABLE_TOOLS] [/AVAILABLE_TOOLS] [TOOL_RESULTS] [/TOOL_RESULTS] [TOOL_CALLS] [ARGS] [CALL_ID] [SYSTEM_PROMPT] [/SYSTEM_PROMPT]"
        ),
        "</s>",
        _tokens("</s>"),
        bos="<s>",
    ),
    "deepseek-v3": Family(
        "deepseek-v3",
        _DEEPSEEK_V3,
        _tokens(
            "<｜▁pad▁｜> <｜begin▁of▁sentence｜> <｜end▁of▁sentence｜> <｜User｜> <｜Assistant｜> <think> </think> <｜tool▁calls▁begin｜> <｜tool▁calls▁end｜> <｜tool▁call▁begin｜> <｜tool▁call▁end｜> <｜tool▁sep｜> <｜tool▁outputs▁begin｜> <｜tool▁outputs▁end｜> <｜tool▁output▁begin｜> <｜tool▁output▁end｜>"
        ),
        "<｜end▁of▁sentence｜>",
        _tokens("<｜end▁of▁sentence｜>"),
        bos="<｜begin▁of▁sentence｜>",
    ),
    "kimi-k2": Family(
        "kimi-k2",
        _KIMI_K2,
        _tokens(
            "[PAD] [BOS] [EOS] <|im_end|> <|im_user|> <|im_assistant|> <|im_system|> <|im_middle|> <|tool_calls_section_begin|> <|tool_calls_section_end|> <|tool_call_begin|> <|tool_call_argument_begin|> <|tool_call_end|>"
        ),
        "<|im_end|>",
        _tokens("<|im_end|> [EOS]"),
        bos="[BOS]",
    ),
    "gpt-oss": Family(
        "gpt-oss",
        _GPT_OSS,
        _tokens(
            "<|endoftext|> <|startoftext|> <|start|> <|end|> <|message|> <|channel|> <|constrain|> <|return|> <|call|>"
        ),
        "<|return|>",
        _tokens("<|return|> <|call|> <|endoftext|>"),
        bos="<|startoftext|>",
    ),
}


def family_spec(name: str) -> Family:
    """The family `name`; UnknownNameError (naming the nearest) for any other."""
    from hrl.registry import require

    require(FAMILIES, "model family", name)
    return FAMILIES[name]
