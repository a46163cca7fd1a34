"""The chat template a converted SmolLM2 folder carries: the reference engine's prompts, in jinja.

:data:`HERMES_CHATML` renders, through transformers' ``tokenizer.apply_chat_template(messages,
tools=tools, add_generation_prompt=...)``, exactly the string the llama.cpp reference engine
renders for the same request (``ReferenceModel.render``: SmolLM2's own ChatML template over
:func:`rollwire.capture.dialects.hermes.prepare_messages`):

- the tool manifest (:func:`~rollwire.capture.dialects.hermes.manifest_prompt`) is appended to a
  leading system message after ``"\\n\\n"``, or is a system turn of its own;
- SmolLM2's default system prompt appears only when the first message is not a system message
  and no tools are offered;
- an assistant turn's tool calls follow its content as ``<tool_call>\\n{json}\\n</tool_call>``
  lines joined by ``"\\n"`` (:func:`~rollwire.capture.dialects.hermes.call_text`), JSON written
  as ``json.dumps`` writes it (ASCII-escaped, ``", "`` and ``": "`` separators);
- a ``tool`` message is a ChatML turn of its own.

Every assistant turn's content, calls and closing ``<|im_end|>`` sit in ``{% generation %}``, so
``return_assistant_tokens_mask=True`` (TRL's ``SFTTrainer(assistant_only_loss=True)``) marks the
tokens the engine samples: not the ``<|im_start|>assistant\\n`` header, not the ``"\\n"`` after
``<|im_end|>``.

Arguments: a dict (Hugging Face's convention) is written with ``tojson``; a string (OpenAI's
convention) is written verbatim, as the JSON text it is. Jinja cannot parse JSON, so a string
that is not ``json.dumps`` output (other spacing, raw non-ASCII, not JSON at all) renders
differently from ``call_text``, which re-serialises it: pass messages through :func:`hf_messages`
first (the torch engine does) and both conventions render exactly.
"""

from __future__ import annotations

from typing import Any

from rollwire.capture.dialects.hermes import ToolFormatError, template_arguments, text_of

SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Built from adjacent literals without newlines between tags, so trim_blocks/lstrip_blocks (which
# transformers and the reference engine both set) cannot change the output. "\n" inside a jinja
# string literal is jinja's escape for a newline.
HERMES_CHATML = (
    # message content: a string, or a list of text parts (anything else is refused)
    "{%- macro plain(c) -%}"
    "{%- if c is string -%}{{- c -}}"
    "{%- elif c is defined and c is not none and c is not mapping -%}"
    "{%- for part in c -%}"
    "{%- if part is not mapping or part['type'] != 'text' -%}"
    "{{- raise_exception('message content parts must be text parts') -}}"
    "{%- endif -%}"
    "{{- part['text'] -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    # one call: json.dumps({'name': ..., 'arguments': ...}); string arguments are JSON text
    "{%- macro call(c) -%}"
    "{%- set fn = c['function'] if c['function'] is mapping else {} -%}"
    "{%- set name = fn['name'] if fn['name'] is defined else '' -%}"
    "{%- set args = fn['arguments'] if fn['arguments'] is defined else none -%}"
    "{{- '<tool_call>\\n{\"name\": ' + name | tojson(ensure_ascii=true) + ', \"arguments\": ' -}}"
    "{{- (args if args is string else args | tojson(ensure_ascii=true)) + '}\\n</tool_call>' -}}"
    "{%- endmacro -%}"
    # the manifest, as hermes.manifest_prompt writes it
    "{%- if tools -%}"
    "{%- set specs = namespace(text='') -%}"
    "{%- for t in tools -%}"
    "{%- set spec = (t['function'] if t['function'] is defined else t) | tojson(ensure_ascii=true) -%}"
    "{%- set specs.text = specs.text + ('\\n' if not loop.first else '') + spec -%}"
    "{%- endfor -%}"
    "{%- set manifest = 'You may call one or more functions to assist with the user query. "
    "Function signatures are within <tools></tools> XML tags:\\n<tools>\\n' + specs.text + "
    "'\\n</tools>\\nFor each function call, return a JSON object with the function name and "
    'arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": '
    '<function-name>, "arguments": <args-json-object>}\\n</tool_call>\' -%}'
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- set body = namespace(text=plain(message['content'])) -%}"
    "{%- if loop.first and message['role'] != 'system' -%}"
    "{%- if tools -%}{{- '<|im_start|>system\\n' + manifest + '<|im_end|>\\n' -}}"
    "{%- else -%}{{- '<|im_start|>system\\n" + SMOLLM2_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif loop.first and tools -%}"
    "{%- set body.text = body.text + '\\n\\n' + manifest -%}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for c in message['tool_calls'] -%}"
    "{%- set body.text = body.text + ('\\n' if body.text else '') + call(c) -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- generation -%}{{- body.text + '<|im_end|>' -}}{%- endgeneration -%}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + body.text + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def hf_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages in the shape :data:`HERMES_CHATML` renders exactly like the reference engine:
    content as plain text (``hermes.text_of``: text parts joined, other parts refused), assistant
    tool-call arguments parsed from JSON strings. Ids and other fields of a call are kept."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ToolFormatError(f"{where} has no string 'role'", param=where)
        role = message["role"]
        item: dict[str, Any] = {"role": role, "content": text_of(message.get("content"), where)}
        calls = message.get("tool_calls") or []
        if role == "assistant" and calls:
            normalised = []
            for j, call in enumerate(calls):
                if not isinstance(call, dict):
                    raise ToolFormatError(f"{where}.tool_calls[{j}] must be an object", param=where)
                fn = call.get("function") or {}
                if not isinstance(fn, dict):
                    raise ToolFormatError(
                        f"{where}.tool_calls[{j}].function must be an object", param=where
                    )
                normalised.append(
                    {
                        **call,
                        "function": {
                            **fn,
                            "name": fn.get("name", ""),
                            "arguments": template_arguments(fn.get("arguments")),
                        },
                    }
                )
            item["tool_calls"] = normalised
        out.append(item)
    return out
