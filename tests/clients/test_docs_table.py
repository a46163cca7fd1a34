"""The client table in docs/guides/mcp-clients.md is the matrix's own table, and every config
block the guide shows is one the matrix uses."""

from __future__ import annotations

import json
import tomllib

from tests.clients.matrix import CLIENTS, INSPECTOR, ROOT, TEMPLATES

GUIDE = ROOT / "docs" / "guides" / "mcp-clients.md"


def _rows() -> dict[str, list[str]]:
    rows = {}
    for line in GUIDE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and cells[0] in {*CLIENTS, "mcp-inspector"}:
            rows[cells[0]] = cells
    return rows


def test_the_guide_has_one_row_per_client_with_the_version_tested():
    rows = _rows()
    assert set(rows) == {*CLIENTS, "mcp-inspector"}
    for name, client in CLIENTS.items():
        _, version, transport, wire, names, works = rows[name]
        assert version == client.version, name
        assert transport == "stdio, http + bearer", name
        assert wire == client.dialect, name
        assert names == f"`{client.tool_names}`", name
        assert works == "every tool, arguments intact, results and errors read", name
    assert rows["mcp-inspector"][1] == INSPECTOR.version


def test_every_config_block_the_guide_shows_parses_and_is_one_the_matrix_fills_in():
    text = GUIDE.read_text()
    shown = {line.split('"')[1] for line in text.splitlines() if line.startswith("--8<--")}
    files = {f"examples/mcp_clients/{p.name}" for p in TEMPLATES.iterdir()}
    assert shown == files
    for name in CLIENTS:
        for transport in ("stdio", "http"):
            path = TEMPLATES / f"{name}.{transport}.{'toml' if name == 'codex' else 'json'}"
            parsed = (
                tomllib.loads(path.read_text()) if name == "codex" else json.loads(path.read_text())
            )
            assert parsed, path
