"""Wire dialects of the capture proxy: ``chat`` (OpenAI chat-completions, what the engine
speaks) and the dialects translated to it, one module each (see :mod:`.base`)."""

from __future__ import annotations

import functools
import importlib

from rollwire.capture.dialects.base import Dialect

# name -> module defining DIALECT. Adding a dialect is one module and one entry here.
DIALECT_MODULES: dict[str, str] = {
    "responses": "rollwire.capture.dialects.responses",
    "anthropic": "rollwire.capture.dialects.anthropic",
    "google": "rollwire.capture.dialects.google",
}


@functools.cache
def load_dialects() -> tuple[Dialect, ...]:
    """Every dialect whose module exists, in table order (looked up once per process)."""
    found = []
    for module in DIALECT_MODULES.values():
        try:
            found.append(importlib.import_module(module).DIALECT)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
    return tuple(found)
