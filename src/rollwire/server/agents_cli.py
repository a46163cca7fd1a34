"""``rollwire agents``: the agents rollwire installs from npm or PyPI, and installing them."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from rollwire.server import options


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _root(args: argparse.Namespace) -> Path:
    from rollwire.harnesses.harbor.installs import agents_root

    return Path(args.dir).expanduser().resolve() if args.dir else agents_root()


def _rows(root: Path) -> list[dict[str, Any]]:
    from rollwire.harnesses.harbor.installs import PACKAGES, installed_here

    rows = []
    for name, package in PACKAGES.items():
        installed = installed_here(name, root)
        rows.append(
            {
                "harness": name,
                "registry": package.registry,
                "package": package.spec,
                "binaries": list(package.binaries),
                "installed": installed is not None,
                "path": str(installed.prefix) if installed else str(root / package.dirname),
            }
        )
    return rows


def _cmd_list(args: argparse.Namespace) -> int:
    """each agent's package, pinned version and install state"""
    root = _root(args)
    rows = _rows(root)
    if args.json:
        print(json.dumps({"root": str(root), "agents": rows}, indent=2))
        return 0
    for row in rows:
        state = "installed" if row["installed"] else "not installed (installed on first use)"
        print(f"{row['harness']:16} {row['package']:36} {row['registry']:5} {state}")
    print(f"installs live in {root} ($ROLLWIRE_AGENTS_DIR or --dir)")
    return 0


def _cmd_install(args: argparse.Namespace) -> int:
    """install agents now (each once per host)"""
    from rollwire.harnesses.harbor.installs import PACKAGES, AgentInstallError, ensure_installed

    names = list(PACKAGES) if args.all else args.harnesses
    unknown = [n for n in names if n not in PACKAGES]
    if unknown or not names:
        what = f"{', '.join(unknown)}: not installed by rollwire" if unknown else "name an agent"
        _say(f"rollwire agents install: {what}; known: {', '.join(PACKAGES)} (or --all)")
        return 2
    root = _root(args)
    status = 0
    for name in names:
        try:
            installed = asyncio.run(
                ensure_installed(name, root, progress=lambda m, n=name: _say(f"{n}: {m}"))
            )
        except AgentInstallError as exc:
            _say(f"rollwire agents install: {name}: {exc}")
            status = 1
            continue
        _say(f"{name}: ready at {installed.prefix}")
    return status


def add_commands(sub: Any) -> None:
    """agents rollwire installs from npm/PyPI for Harbor rollouts: list, install

    Harbor's installers fetch agents from hosts a training cluster often cannot reach. rollwire
    installs each agent from its registry instead (npm agents on a Node from PyPI, PyPI agents
    in a venv of the host's python3), once per host, and mounts it read-only into every trial.
    A rollout installs what it needs on first use; `install` does it ahead of time.
    """
    o = options
    verbs = o.verbs(sub, "agents", add_commands, o.AGENTS_DIR)
    o.command(verbs, "list", _cmd_list, o.JSON)
    o.command(verbs, "install", _cmd_install, o.AGENT_NAMES, o.ALL_AGENTS)
