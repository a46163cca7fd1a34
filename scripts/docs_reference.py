"""The documentation's generated pages: built from the code at every ``mkdocs build``, so they
cannot drift from it (an mkdocs hook, named in ``mkdocs.yml``).

- ``reference/cli.md``: every command of ``rollwire.server.cli.build_parser()`` with its
  description and every option (flags, metavar, default, choices, help).
- ``reference/mcp.md``: every tool of ``rollwire.server.mcp_app.build_server()`` as a client
  lists it (``tools/list`` through the MCP client, in memory): description, each argument with
  its type, default, bounds and description, the result's fields; and the resource templates.
- ``benchmarks.md``: ``bench/README.md`` as it is, its relative links written as code paths
  (they point outside ``docs/``).
- Markers in hand-written pages, replaced as the page is read: ``<!-- rollwire:bounds -->``
  (the table of ``rollwire.bounds.TABLE``) and ``<!-- rollwire:document-fields -->`` (the field
  tables of ``rollwire.capture.export.RolloutDocument``, with the notes below; a field without
  a note, or a note without a field, is a warning, which fails the strict build).

Only public entry points are read (``build_parser``, ``build_server``, ``bounds.TABLE``, the
document's pydantic models). The functions are pure apart from ``mcp_tools`` (it starts the
server in memory) and are what ``tests/docs`` checks.
"""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.rollwire_reference")

ROOT = Path(__file__).resolve().parents[1]
MARKERS = ("bounds", "document-fields")

# --- markdown helpers --------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def text(value: str | None) -> str:
    """Plain text (argparse help, a tool description) as markdown: backtick spans kept as code,
    everything else escaped so ``<answer>``, ``*`` or ``[`` render as written."""
    if not value:
        return ""
    out, last = [], 0
    for match in _CODE_SPAN.finditer(value):
        out.append(_escape(value[last : match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(_escape(value[last:]))
    return " ".join("".join(out).split())


def _escape(value: str) -> str:
    value = value.replace("\\", "\\\\").replace("&", "&amp;")
    value = value.replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([*_\[\]|#])", r"\\\1", value)


def code(value: Any) -> str:
    """``value`` as an inline code span (a longer fence when it holds a backtick)."""
    value = str(value)
    fence = "``" if "`" in value else "`"
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


# --- the CLI -----------------------------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def cli_commands(
    parser: argparse.ArgumentParser | None = None, prefix: str = "rollwire"
) -> list[tuple[str, str | None, argparse.ArgumentParser]]:
    """Every command under ``parser`` (default: ``build_parser()``), depth first, as
    ``(full name, one-line help, its parser)``."""
    if parser is None:
        from rollwire.server.cli import build_parser

        parser = build_parser()
    found: list[tuple[str, str | None, argparse.ArgumentParser]] = []
    sub = _subparsers(parser)
    if sub is None:
        return found
    helps = {choice.dest: choice.help for choice in sub._choices_actions}
    for name, child in sub.choices.items():
        full = f"{prefix} {name}"
        found.append((full, helps.get(name), child))
        found.extend(cli_commands(child, full))
    return found


def _signature(action: argparse.Action) -> str:
    if not action.option_strings:
        return code(action.metavar or action.dest.upper())
    if action.nargs == 0:
        return ", ".join(code(flag) for flag in action.option_strings)
    if action.choices:
        meta = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        meta = action.metavar or action.dest.upper()
        meta = meta if isinstance(meta, str) else " ".join(meta)
    return ", ".join(code(f"{flag} {meta}") for flag in action.option_strings)


def _help(action: argparse.Action, prog: str) -> str | None:
    if action.help is None or action.help == argparse.SUPPRESS:
        return None
    try:
        return action.help % {**vars(action), "prog": prog}
    except (KeyError, TypeError, ValueError):
        return action.help


def _option_line(action: argparse.Action, prog: str) -> str:
    facts: list[str] = []
    if action.required:
        facts.append("required")
    if isinstance(action, argparse._AppendAction):
        facts.append("repeatable")
    default = action.default
    if action.nargs != 0 and default not in (None, argparse.SUPPRESS) and default != []:
        facts.append(f"default {code(default)}")
    head = _signature(action) + (f" ({'; '.join(facts)})" if facts else "")
    help_text = text(_help(action, prog))
    return f"- {head}" + (f": {help_text}" if help_text else "")


def cli_markdown() -> str:
    """The CLI reference page."""
    from rollwire.server.cli import build_parser

    parser = build_parser()
    commands = cli_commands(parser)
    lines = [
        "# CLI reference",
        "",
        "Generated from `rollwire.server.cli.build_parser()` at every build of this site, so it is",
        "the command line as the code defines it. `rollwire COMMAND --help` prints the same.",
        "",
        "| command | what |",
        "|---|---|",
    ]
    for full, summary, _ in commands:
        anchor = full.replace(" ", "-")
        lines.append(f"| [{code(full)}](#{anchor}) | {text(summary)} |")
    for full, summary, child in commands:
        anchor = full.replace(" ", "-")
        level = "#" * min(2 + full.count(" ") - 1, 4)
        lines += ["", f"{level} {full} {{#{anchor}}}", ""]
        if summary:
            lines += [f"*{text(summary)}*", ""]
        if child.description:
            lines += [text(child.description), ""]
        options = [
            a
            for a in child._actions
            if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)
        ]
        sub = _subparsers(child)
        if sub is not None:
            names = ", ".join(
                f"[{code(f'{full} {name}')}](#{full.replace(' ', '-')}-{name})"
                for name in sub.choices
            )
            lines += [f"Subcommands: {names}.", ""]
        if options:
            lines += [_option_line(a, child.prog) for a in options]
        else:
            lines.append("No options.")
    return "\n".join(lines) + "\n"


# --- the MCP tools -----------------------------------------------------------------------------


async def _listing() -> tuple[list[Any], list[Any]]:
    from mcp import Client

    from rollwire.server.mcp_app import build_server

    async with Client(build_server()) as client:
        tools = (await client.list_tools()).tools
        templates = (await client.list_resource_templates()).resource_templates
    return list(tools), list(templates)


def mcp_tools() -> tuple[list[Any], list[Any]]:
    """The tools and resource templates a client lists from ``build_server()`` (in memory)."""
    import anyio

    return anyio.run(_listing)


_BOUNDS = (
    ("minimum", ">="),
    ("exclusiveMinimum", ">"),
    ("maximum", "<="),
    ("exclusiveMaximum", "<"),
    ("minLength", "length >="),
    ("maxLength", "length <="),
    ("minItems", "items >="),
    ("maxItems", "items <="),
)


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        name = ref.rsplit("/", 1)[1]
        return name, defs.get(name, {})
    return None, schema


def schema_type(schema: dict[str, Any], defs: dict[str, Any], link: bool = False) -> str:
    """A JSON schema's type in words: ``integer``, ``Sampling``, ``list of string``, an enum's
    values; with ``link``, a shared object's name links to its section (``#name``)."""
    name, schema = _resolve(schema, defs)
    if name and "enum" not in schema:
        return f"[{name}](#{name.lower()})" if link else name
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(schema_type(s, defs, link) for s in schema[key])
    if "enum" in schema:
        return " \\| ".join(code(v) for v in schema["enum"])
    kind = schema.get("type")
    if kind == "array":
        if "prefixItems" in schema:
            inner = ", ".join(schema_type(s, defs, link) for s in schema["prefixItems"])
            return f"[{inner}]"
        items = schema.get("items")
        if not items:
            return "list"
        inner = schema_type(items, defs, link)
        return f"list of ({inner})" if " or " in inner else f"list of {inner}"
    if isinstance(kind, list):
        return " or ".join(kind)
    return kind or "any"


def _bounds(schema: dict[str, Any]) -> list[str]:
    return [f"{sign} {schema[key]:,}" for key, sign in _BOUNDS if key in schema]


def _argument_lines(
    props: dict[str, Any], required: list[str], defs: dict[str, Any], indent: str = ""
) -> list[str]:
    lines: list[str] = []
    for name, prop in props.items():
        facts = [schema_type(prop, defs)]
        facts.append("required" if name in required else "optional")
        if "default" in prop:
            facts.append(f"default {code(_json(prop['default']))}")
        facts += _bounds(prop)
        line = f"{indent}- {code(name)} ({'; '.join(facts)})"
        if prop.get("description"):
            line += f": {text(prop['description'])}"
        lines.append(line)
        nested = _nested(prop, defs)
        if nested is not None:
            sub_props, sub_required = nested
            lines += _argument_lines(sub_props, sub_required, defs, indent + "    ")
    return lines


def _nested(prop: dict[str, Any], defs: dict[str, Any]) -> tuple[dict, list] | None:
    """The fields of an argument that is (or may be) an object of a shared definition."""
    for branch in [prop, *prop.get("anyOf", [])]:
        _, resolved = _resolve(branch, defs)
        if "properties" in resolved:
            return resolved["properties"], resolved.get("required", [])
    return None


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def mcp_markdown() -> str:
    """The MCP reference page."""
    from rollwire import bounds

    tools, templates = mcp_tools()
    lines = [
        "# MCP reference",
        "",
        "Generated at every build of this site from what `rollwire.server.mcp_app.build_server()`",
        "answers to `tools/list` and `resources/templates/list`, so it is the tool list a client",
        "(and its model) reads. The listing is compact: every text argument also takes at most",
        f"{bounds.MAX_TEXT:,} characters and every seed is a signed 64-bit integer; those bounds",
        "and the others are in [Reliability and security](../reliability.md#bounded-work). A value",
        "past a bound, or an unknown key, is a tool error that names the field.",
        "",
        "| tool | arguments |",
        "|---|---|",
    ]
    for tool in tools:
        args = ", ".join(tool.input_schema.get("properties", {}))
        lines.append(f"| [{code(tool.name)}](#{tool.name}) | {args} |")
    for tool in tools:
        schema = tool.input_schema
        defs = schema.get("$defs", {})
        lines += ["", f"## {tool.name} {{#{tool.name}}}", "", text(tool.description), ""]
        props = schema.get("properties", {})
        if props:
            lines += ["**Arguments**", ""]
            lines += _argument_lines(props, schema.get("required", []), defs)
        else:
            lines.append("No arguments.")
        out = tool.output_schema or {}
        out_props = out.get("properties", {})
        if out_props:
            out_defs = out.get("$defs", {})
            returned = ", ".join(
                f"{code(name)} ({schema_type(prop, out_defs)})" for name, prop in out_props.items()
            )
            lines += ["", f"**Result** (structured content): {returned}."]
    lines += ["", "## Resources {#resources}", ""]
    for template in templates:
        line = f"- {code(template.uri_template)} ({template.name}"
        line += f", {template.mime_type})" if template.mime_type else ")"
        if template.description:
            line += f": {text(template.description)}"
        lines.append(line)
    return "\n".join(lines) + "\n"


# --- bounds ------------------------------------------------------------------------------------


def bounds_table() -> str:
    """``rollwire.bounds.TABLE`` as a markdown table: one ``| argument | accepted |`` row each."""
    from rollwire import bounds

    lines = ["| argument | accepted |", "|---|---|"]
    lines += [f"| {argument} | {limit} |" for argument, limit in bounds.TABLE]
    return "\n".join(lines) + "\n"


# --- the rollout document ----------------------------------------------------------------------

#: What each field of the document means. The field list itself comes from the models: a field
#: the models have and this does not (or the reverse) is a warning, so strict builds fail.
DOCUMENT_NOTES: dict[str, dict[str, str]] = {
    "RolloutDocument": {
        "version": "`rollwire.rollout/1`",
        "capture_level": "`tokens` (ids and checked logprobs) or `text` (eval data only)",
        "rollout_type": "`train` or `eval`",
        "stats": "shape and yield of the rollout (below)",
        "findings": "rollout-level findings",
        "turns": "one record per model call, in arrival order",
        "sequences": "one per root-to-leaf path of the call graph",
        "metadata": "what the capture session was opened with (`POST /sessions` `metadata`)",
    },
    "RolloutStats": {
        "turns": "model calls",
        "roots": "calls with no parent",
        "leaves": "calls with no child",
        "forks": "calls with more than one child (a retry, a branch)",
        "discarded": "childless siblings of a branch that went on, abandoned duplicates",
        "retokenized": "calls that started a new sequence because the engine re-tokenised a reply",
        "unlinked": "calls linked to nothing",
        "sequences": "root-to-leaf paths",
        "trainable_sequences": "sequences with at least one loss target",
        "trainable_tokens": "loss targets over all sequences",
        "token_in": "calls per token-in mode: `rendered`, `spliced`, `fallback:<reason>`",
        "weight_versions": "the engine weight versions that sampled the agent's calls, in the "
        "order first seen (more than one: a `weight_versions_mixed` finding)",
    },
    "TurnRecord": {
        "node_id": "this call's id in the graph",
        "parent_id": "the call whose prompt + sampled ids is the longest exact prefix of this "
        "prompt",
        "retokenized_from": "the call whose reply the engine re-tokenised differently, when this "
        "call started a new sequence because of it",
        "role": "`agent`, `auxiliary` or `discarded`",
        "trainable": "its sampled tokens are loss targets",
        "auxiliary": "sent with `X-Rollwire-Role: auxiliary` (a title, a summary): context only",
        "prompt_token_ids": "the **full** prompt, as the engine tokenised it",
        "completion_token_ids": "the sampled ids",
        "logprobs": "the engine's logprob per sampled id; null when they failed a check (never "
        "zero-filled)",
        "finish_reason": "the engine's",
        "dialect": "the wire dialect the agent spoke (`openai`, `responses`, `anthropic`, "
        "`google`)",
        "model": "the model the engine named",
        "requested_params": "the sampling parameters the agent asked for",
        "applied_params": "what the proxy sent (no-op values at the tokens tier)",
        "findings": "this call's findings",
        "reply": "the reply as the agent received it",
        "usage": "the engine's token usage",
        "created_at": "when the call arrived (Unix seconds)",
        "messages": "the request's messages",
        "constrained_positions": "completion positions forced by constrained decoding "
        "(logprob 0.0): masked in sequences",
        "token_in_mode": "`rendered`, `spliced` or `fallback:<reason>`",
        "token_in_path": "how a token prompt reached the engine: `vllm_chat`, `sglang_chat`, "
        "`completions`",
        "parent_call_id": "the call this one continues by token-in",
        "carried_len": "with `prompt[:carried_len] == parent.prompt + parent.sampled`, checked "
        "at export",
        "synthesized_positions": "positions the proxy synthesised (a turn-close token after a "
        "length cut): masked",
        "drift": "how many positions the canonical render would have differed",
        "top_logprobs": "per completion position, the engine's top candidates as `[id, logprob]` "
        "pairs, when the agent asked for them; for inspection only",
        "weight_version": "the engine weights that sampled this call (`GET /weight_info` read "
        "before and after it, or the version a trainer announced); null when unknown, or when "
        "it changed during the call (then the call is masked: `weight_version_changed`)",
    },
    "TrainingSequence": {
        "sequence_id": "the sequence's id",
        "node_ids": "the calls on the path, root first",
        "role": "`agent`, `auxiliary` or `discarded`",
        "trainable": "it has loss targets and is agent work",
        "input_ids": "the leaf's prompt + sampled ids, exactly as the engine saw and produced them",
        "loss_mask": "1 only on sampled tokens with checked logprobs",
        "logprobs": "aligned with `input_ids`, 0.0 where masked",
        "turn_spans": "where each call's sampled tokens sit (below)",
        "n_trainable_tokens": "ones in `loss_mask`",
        "findings": "this path's findings",
        "messages": "text tier: the conversation of this path",
    },
    "TurnSpan": {
        "node_id": "the call",
        "start": "first position in `input_ids`",
        "end": "one past the last",
        "trainable": "its tokens are loss targets",
        "weight_version": "the engine weights that sampled them (null: unknown)",
    },
    "Finding": {
        "level": "`FATAL`, `WARN` or `INFO`",
        "code": "a stable name, e.g. `retokenized`",
        "message": "what happened, in words",
        "node_id": "the call it is about, if one",
    },
}


def document_models() -> dict[str, dict[str, Any]]:
    """The document's object schemas by name, the document first (pydantic's JSON schema)."""
    from rollwire.capture.export import RolloutDocument

    schema = RolloutDocument.model_json_schema()
    defs = schema.pop("$defs", {})
    models = {"RolloutDocument": schema}
    models.update({name: s for name, s in defs.items() if "properties" in s})
    return models


def document_problems() -> list[str]:
    """Fields without a note and notes without a field (empty when the notes are complete)."""
    problems = []
    models = document_models()
    for name, schema in models.items():
        fields, notes = set(schema["properties"]), set(DOCUMENT_NOTES.get(name, {}))
        problems += [f"{name}.{f}: a field with no note in DOCUMENT_NOTES" for f in fields - notes]
        problems += [f"{name}.{f}: a note for no field" for f in notes - fields]
    problems += [
        f"{name}: a model not in the document" for name in set(DOCUMENT_NOTES) - set(models)
    ]
    return sorted(problems)


def document_tables() -> str:
    """One table per object of the document: field, type, required or default, meaning."""
    from rollwire.capture.export import RolloutDocument

    defs = RolloutDocument.model_json_schema().get("$defs", {})
    lines: list[str] = []
    for name, schema in document_models().items():
        lines += [f"### {name}", ""]
        if schema.get("description"):
            lines += [text(schema["description"]), ""]
        lines += ["| field | type | | what |", "|---|---|---|---|"]
        required = schema.get("required", [])
        notes = DOCUMENT_NOTES.get(name, {})
        for field, prop in schema["properties"].items():
            if field in required:
                need = "required"
            elif "default" in prop:
                need = f"default {code(_json(prop['default']))}"
            else:
                need = "optional"
            lines.append(
                f"| {code(field)} | {schema_type(prop, defs, link=True)} | {need} "
                f"| {notes.get(field, '')} |"
            )
        lines.append("")
    return "\n".join(lines)


# --- benchmarks --------------------------------------------------------------------------------

_LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")


def rewrite_links(source: str, folder: str = "bench") -> str:
    """Relative markdown links of a file in ``folder`` written as code paths (``folder/...``):
    they point outside ``docs/``; URLs and in-page anchors are kept."""

    def rewrite(match: re.Match[str]) -> str:
        _image, label, target = match.groups()
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            return match.group(0)
        path = (Path(folder) / target.split("#", 1)[0]).as_posix()
        return f"{label} ({code(path)})" if label and label.strip("`") != path else code(path)

    return _LINK.sub(rewrite, source)


def benchmarks_markdown() -> str:
    """``bench/README.md`` with its relative links written as code paths (``bench/...``)."""
    return rewrite_links((ROOT / "bench" / "README.md").read_text(encoding="utf-8"))


# --- the hook ----------------------------------------------------------------------------------

GENERATED = {
    "reference/cli.md": cli_markdown,
    "reference/mcp.md": mcp_markdown,
    "benchmarks.md": benchmarks_markdown,
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for src_uri, build in GENERATED.items():
        if files.get_file_from_path(src_uri) is not None:
            log.warning("docs/%s exists but is generated: remove it", src_uri)
            continue
        files.append(File.generated(config, src_uri, content=build()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- rollwire:bounds -->" in markdown:
        markdown = markdown.replace("<!-- rollwire:bounds -->", bounds_table())
    if "<!-- rollwire:document-fields -->" in markdown:
        for problem in document_problems():
            log.warning("rollout document: %s", problem)
        markdown = markdown.replace("<!-- rollwire:document-fields -->", document_tables())
    for marker in re.findall(r"<!-- rollwire:([\w-]+) -->", markdown):
        log.warning("%s: unknown marker rollwire:%s", page.file.src_uri, marker)
    return markdown
