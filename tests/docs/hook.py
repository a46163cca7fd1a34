"""The docs site's hook module (``scripts/docs_reference.py``), loaded by path: it is an mkdocs
hook, not part of the ``rollwire`` package."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "scripts" / "docs_reference.py"


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", HOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
