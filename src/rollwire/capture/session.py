"""Capture sessions: one per rollout; its id is the API key the agent uses."""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rollwire.capture.export import RolloutDocument, export_rollout
from rollwire.capture.findings import Finding
from rollwire.capture.rollout import CaptureLevel, RolloutGraph
from rollwire.capture.splice import CallMemory

MAX_KEPT_ERRORS = 200


@dataclass
class CaptureSession:
    """The calls of one rollout, and what went wrong on the way."""

    session_id: str
    capture_level: CaptureLevel
    metadata: dict[str, Any] = field(default_factory=dict)
    max_model_calls: int | None = None
    created_at: float = field(default_factory=time.time)
    last_call_at: float | None = None
    graph: RolloutGraph = field(init=False)
    findings: list[Finding] = field(default_factory=list)  # upstream errors, refused calls
    n_calls: int = 0
    n_errors: int = 0
    # tool-call id -> the arguments string the engine sampled: a dialect that carries
    # arguments as an object (Anthropic input, Google args) gets the exact string back.
    tool_arguments: dict[str, str] = field(default_factory=dict, repr=False)
    # Token-in continuation: what each call sampled, and the model's turn-close token.
    calls: list[CallMemory] = field(default_factory=list, repr=False)
    close_id: int | None = None
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.graph = RolloutGraph(self.capture_level)

    def begin_call(self) -> str | None:
        """Reserve a node id for a model call, or None when the call budget is spent."""
        with self._lock:
            if self.max_model_calls is not None and self.n_calls >= self.max_model_calls:
                return None
            self.n_calls += 1
            self.last_call_at = time.time()
            return f"t{next(self._ids)}"

    def record(self, finding: Finding, *, error: bool = False) -> None:
        """Keep a session-level finding (the newest MAX_KEPT_ERRORS of them)."""
        with self._lock:
            if error:
                self.n_errors += 1
            self.findings.append(finding)
            del self.findings[:-MAX_KEPT_ERRORS]

    def summary(self) -> dict[str, Any]:
        """What GET /sessions shows for this session."""
        now = time.time()
        return {
            "session_id": self.session_id,
            "capture_level": self.capture_level.value,
            "metadata": self.metadata,
            "created_at": self.created_at,
            "turns": len(self.graph),
            "roots": self.graph.count_roots(),
            "calls": self.n_calls,
            "errors": self.n_errors,
            "max_model_calls": self.max_model_calls,
            "seconds_since_last_call": None
            if self.last_call_at is None
            else round(now - self.last_call_at, 3),
        }

    def document(self) -> RolloutDocument:
        """The rollout document of everything captured so far."""
        with self._lock:
            extra = list(self.findings)
        meta = {"session_id": self.session_id, **self.metadata}
        return export_rollout(self.graph, extra_findings=extra, metadata=meta)


class SessionStore:
    """Live sessions by id. Thread-safe: sessions are opened from many event loops."""

    def __init__(self, capture_level: CaptureLevel) -> None:
        self.capture_level = capture_level
        self._sessions: dict[str, CaptureSession] = {}
        self._lock = threading.Lock()

    def open(
        self, *, metadata: dict[str, Any] | None = None, max_model_calls: int | None = None
    ) -> CaptureSession:
        """A new session with an unguessable id."""
        session = CaptureSession(
            session_id="rw-" + secrets.token_urlsafe(24),
            capture_level=self.capture_level,
            metadata=dict(metadata or {}),
            max_model_calls=max_model_calls,
        )
        with self._lock:
            self._sessions[session.session_id] = session
        return session

    def get(self, session_id: str | None) -> CaptureSession | None:
        """The live session with this id, if any."""
        if not session_id:
            return None
        return self._sessions.get(session_id)

    def close(self, session_id: str) -> CaptureSession | None:
        """Forget a session; returns it (or None when unknown)."""
        with self._lock:
            return self._sessions.pop(session_id, None)

    def all(self) -> list[CaptureSession]:
        """Live sessions, oldest first."""
        with self._lock:
            return sorted(self._sessions.values(), key=lambda s: s.created_at)
