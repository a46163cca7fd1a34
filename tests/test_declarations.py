"""One declaration per CLI option and per MCP tool argument, shared by every command and tool
that takes it (rollwire.server.options, rollwire.server.arguments)."""

from __future__ import annotations

import argparse
import ast
import inspect
import json
from collections import defaultdict
from pathlib import Path

import pytest

from rollwire.server import arguments, options
from rollwire.server.cli import build_parser
from rollwire.server.mcp_app import build_server

SERVER = Path(options.__file__).parent


def _commands(parser: argparse.ArgumentParser, path: str = "rollwire"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def _looks(action: argparse.Action) -> str:
    """Everything a user of the option sees of it."""
    return json.dumps(
        [
            type(action).__name__,
            action.option_strings,
            action.dest,
            repr(action.default),
            getattr(action.type, "__name__", repr(action.type)),
            None if action.choices is None else list(action.choices),
            action.required,
            action.nargs,
            action.help,
            action.metavar,
        ]
    )


def test_every_cli_option_comes_from_one_declaration():
    seen: dict[str, set[int]] = defaultdict(set)  # what an option looks like -> declarations
    shared: dict[int, set[str]] = defaultdict(set)  # declaration -> commands
    for path, parser in _commands(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            declaration = getattr(action, "declaration", None)
            assert isinstance(declaration, options.Option), f"{path}: {action.option_strings}"
            seen[_looks(action)].add(id(declaration))
            shared[id(declaration)].add(path)
    copies = {looks: ids for looks, ids in seen.items() if len(ids) > 1}
    assert not copies, f"the same option declared more than once: {copies}"
    # options several commands share, each one declaration
    llm_url = options.LLM_URL_REQUIRED
    assert shared[id(llm_url)] == {"rollwire proxy", "rollwire validate", "rollwire parity"}
    assert len(shared[id(options.JSON)]) >= 5
    assert len(shared[id(options.ON_BAD_DATA)]) == 8  # every command that calls an engine


def test_no_two_cli_declarations_are_the_same():
    declared = [v for v in vars(options).values() if isinstance(v, options.Option)]
    keys = [(o.flags, sorted((k, repr(v)) for k, v in o.kwargs.items())) for o in declared]
    assert len({repr(k) for k in keys}) == len(keys)


def _tools():
    return build_server()._tool_manager.list_tools()  # type: ignore[attr-defined]


def test_every_mcp_argument_comes_from_one_declaration():
    declared = {id(v) for v in vars(arguments).values() if isinstance(v, inspect.Parameter)}
    seen: dict[str, set[int]] = defaultdict(set)  # (name, schema) -> declarations
    names: dict[str, set[str]] = defaultdict(set)
    for tool in _tools():
        params = inspect.signature(tool.fn).parameters
        schema = tool.parameters["properties"]
        assert set(params) == set(schema), tool.name
        for name, param in params.items():
            assert id(param) in declared, f"{tool.name}({name}): not in rollwire.server.arguments"
            required = name in tool.parameters.get("required", ())
            seen[json.dumps([name, schema[name], required], sort_keys=True)].add(id(param))
            names[name].add(tool.name)
    copies = {looks: ids for looks, ids in seen.items() if len(ids) > 1}
    assert not copies, f"the same argument declared more than once: {copies}"
    # shared by several tools, and the same in each
    assert {"run_rollout", "start_rollout", "collect_episodes"} <= names["sampling"]
    assert {"collect_episodes", "push_dataset"} <= names["out_dir"]


def test_run_and_start_rollout_take_the_same_arguments():
    tools = {t.name: t for t in _tools()}
    run, start = (dict(tools[name].parameters) for name in ("run_rollout", "start_rollout"))
    assert run.pop("title") != start.pop("title")
    assert run == start


def test_a_tool_cannot_declare_an_argument_of_its_own():
    with pytest.raises(TypeError, match="declare it in arguments"):

        @arguments.takes(arguments.TASK)
        async def tool(*, task, seed: int = 0) -> None: ...


@pytest.mark.parametrize(
    "module", ["options.py", "arguments.py", "collect_cli.py", "images_cli.py", "agents_cli.py"]
)
def test_the_shared_modules_do_not_import_the_cli_or_the_mcp_app(module):
    tree = ast.parse((SERVER / module).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {
        f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    assert not imported & {"rollwire.server.cli", "rollwire.server.mcp_app"}
