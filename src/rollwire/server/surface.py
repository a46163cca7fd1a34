"""The tool list a client's model reads: the same tools and results, in fewer bytes.

Every MCP client puts ``tools/list`` into its model's context on every conversation, so its
size is a cost paid on every turn. Pydantic's schemas are generous: a ``title`` on every
property, a description on every output field, each tool's output model spelled out in full
(four tools return the same rollout status). Here, as pure functions over JSON schemas:

- descriptions are one line (no docstring indentation);
- input schemas keep every field's constraints, defaults and description (they are how a model
  learns the arguments) and lose ``title`` keywords, ``additionalProperties: false`` on
  nested objects (the server refuses unknown keys, naming them), ``default: null``, the descriptions of
  shared definitions and the bounds every argument of a kind has (text length, the seed range:
  enforced by the server, listed in the README); ``anyOf [X, null]`` is written as X where X
  is a plain type (an optional argument is omitted; null is still accepted);
- output schemas keep the result's top-level fields with their JSON types and which are
  required: enough to validate and to know what comes back; nested shapes are described by the
  tool's text (and validated, in full, by the server before anything is sent).

Structured results are unchanged: tools still return ``structuredContent`` validated against
their full models.
"""

from __future__ import annotations

import inspect
from typing import Any

from mcp.server import MCPServer
from mcp.types import Tool as MCPTool

from rollwire import bounds

_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not")


def compact_input(schema: dict[str, Any], *, top: bool = True) -> dict[str, Any]:
    """``schema`` without ``title`` keywords, ``default: null`` (an omitted argument is the
    same) or the descriptions of shared definitions (the tool's text says what an argument
    is for; each field keeps its own), nullable plain types folded (pure)."""
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" or (key == "default" and value is None) or _implied(key, value):
            continue
        if key == "additionalProperties" and value is False and not top:
            continue  # unknown keys are refused by the server, naming them
        if key == "$defs" and isinstance(value, dict):
            out[key] = {
                name: {k: v for k, v in compact_input(sub, top=False).items() if k != "description"}
                for name, sub in value.items()
            }
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: compact_input(sub, top=False) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[key] = [
                compact_input(sub, top=False) if isinstance(sub, dict) else sub for sub in value
            ]
        elif key in _SUBSCHEMA_ONE and isinstance(value, dict):
            out[key] = compact_input(value, top=False)
        else:
            out[key] = value
    return _fold_nullable(out)


def _implied(key: str, value: Any) -> bool:
    """A bound every argument of its kind has (text length, the 64-bit seed range): enforced
    by the server and listed in the README's table, not repeated in every field."""
    return (
        (key == "maxLength" and value == bounds.MAX_TEXT)
        or (key, value)
        == (
            "additionalProperties",
            True,
        )
        or ((key, value) in (("minimum", bounds.MIN_SEED), ("maximum", bounds.MAX_SEED)))
    )


def compact_text(description: str | None) -> str | None:
    """A docstring as one line: no indentation, no line breaks (pure)."""
    return " ".join(inspect.cleandoc(description).split()) if description else description


def _fold_nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """The null branch of an ``anyOf`` dropped: ``{"anyOf": [X, {"type": "null"}]}`` -> X when
    X is a plain type or a lone ``$ref``: an optional argument is omitted rather than sent as
    null (the server still accepts null)."""
    branches = schema.get("anyOf")
    if not isinstance(branches, list):
        return schema
    plain = [b for b in branches if b != {"type": "null"}]
    if len(plain) == len(branches):
        return schema
    if len(plain) > 1:
        return {**schema, "anyOf": plain}
    if not (isinstance(plain[0].get("type"), str) or set(plain[0]) == {"$ref"}):
        return schema
    if any(k in plain[0] for k in ("anyOf", "oneOf", "allOf")):
        return schema
    if any(k in schema for k in plain[0]):
        return schema  # a keyword on both levels: leave it as it is
    folded = {k: v for k, v in schema.items() if k != "anyOf"}
    return {**plain[0], **folded}


def _json_type(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """The JSON type(s) a property schema admits: a name, a list of names, or None (any)."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1], {})
        return _json_type(target, defs)
    if "type" in schema:
        return schema["type"]
    if "enum" in schema:
        kinds = {type(v).__name__ for v in schema["enum"]}
        return "string" if kinds == {"str"} else None
    branches = schema.get("anyOf") or schema.get("oneOf")
    if isinstance(branches, list):
        types: list[str] = []
        for branch in branches:
            kind = _json_type(branch, defs) if isinstance(branch, dict) else None
            if kind is None:
                return None
            types.extend(kind if isinstance(kind, list) else [kind])
        unique = list(dict.fromkeys(types))
        return unique[0] if len(unique) == 1 else unique
    return None


def compact_output(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """An object schema's top-level fields with their JSON types, and ``required`` (pure).
    Anything else is returned as is."""
    if not schema or schema.get("type") != "object" or "properties" not in schema:
        return schema
    defs = schema.get("$defs", {})
    properties: dict[str, Any] = {}
    for name, sub in schema["properties"].items():
        kind = _json_type(sub, defs)
        properties[name] = {} if kind is None else {"type": kind}
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if schema.get("required"):
        out["required"] = schema["required"]
    return out


class CompactMCPServer(MCPServer):
    """An :class:`MCPServer` whose ``tools/list`` carries compact schemas (module docstring)."""

    async def list_tools(self) -> list[MCPTool]:
        return [
            tool.model_copy(
                update={
                    "description": compact_text(tool.description),
                    "input_schema": compact_input(tool.input_schema),
                    "output_schema": compact_output(tool.output_schema),
                }
            )
            for tool in await super().list_tools()
        ]
