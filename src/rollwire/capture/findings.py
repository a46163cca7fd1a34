"""The one findings type: what a check saw, how bad it is, and where."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict


class Level(StrEnum):
    """How much a finding matters to a trainer."""

    FATAL = "FATAL"  # the data must not be trained on
    WARN = "WARN"  # usable, but something was changed, dropped or masked
    INFO = "INFO"  # worth knowing; nothing was lost


class Finding(BaseModel):
    """One observation from ingest, linking, export or certification."""

    model_config = ConfigDict(frozen=True)

    level: Level
    code: str
    message: str
    node_id: str | None = None


def fatal(code: str, message: str, node_id: str | None = None) -> Finding:
    """A finding that makes the data it names untrainable."""
    return Finding(level=Level.FATAL, code=code, message=message, node_id=node_id)


def warn(code: str, message: str, node_id: str | None = None) -> Finding:
    """A finding for data that is usable but was changed, dropped or masked."""
    return Finding(level=Level.WARN, code=code, message=message, node_id=node_id)


def info(code: str, message: str, node_id: str | None = None) -> Finding:
    """A finding worth reporting that lost nothing."""
    return Finding(level=Level.INFO, code=code, message=message, node_id=node_id)


def has_fatal(findings: list[Finding]) -> bool:
    """True when any finding is FATAL."""
    return any(f.level is Level.FATAL for f in findings)
