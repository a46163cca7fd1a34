"""Weight updates for the reference engine, in vLLM's RL shape, and the pause they need.

A trainer syncs its weights into vLLM (0.32) through HTTP routes: ``/pause``, ``/resume``,
``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``, ``/update_weight_version``, ``GET /weight_info``, ``/weight_checker``.
``rollwire engine --model DIR`` serves the same routes with the same request and reply shapes
(:mod:`rollwire.engine.server`), so one trainer-side client (:class:`rollwire.trl.WeightSync`)
drives both engines.

An update is a session. ``start`` opens it; each ``stage`` (one ``/update_weights``) reads one
chunk of tensors and checks it against the served model (:mod:`rollwire.checkpoints`: no
unknown tensor, every shape and kind right); ``finish`` checks that the staged set is complete
and only then swaps it in, whole, between two model calls. A chunk or a finish that fails ends
the session with an error that names the problem, and the old weights keep serving.

Two transfers that work on a CPU, told apart by ``update_info``'s keys:

- ``{"path": "/abs/folder"}``: a safetensors checkpoint on this machine (the shape of vLLM's
  disk backend), which must lie inside one of the engine's ``--weights-root`` folders;
- ``{"safetensors": "<base64>"}``: the bytes of one safetensors file in the request, for a
  trainer on another machine (``save_pretrained(max_shard_size=...)``, one request per shard).

The pause (:class:`PauseGate`) follows vLLM's modes: ``abort`` stops calls in flight at their
next token (they end with ``finish_reason: "abort"``), ``wait`` lets them finish, ``keep``
freezes them at their next token until ``/resume``; calls that arrive while paused wait. A swap
during a ``keep`` pause continues the frozen calls on the new weights, as vLLM does: the
capture proxy sees the version change around such a call and masks it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from rollwire.checkpoints import (
    CheckpointError,
    TensorSpec,
    file_tensors,
    folder_tensors,
    mismatches,
    parse_header,
    summary,
)
from rollwire.engine.model import Aborted, EngineError, EngineModel

log = logging.getLogger("rollwire.engine")

PauseMode = Literal["abort", "wait", "keep"]
PAUSE_MODES: tuple[PauseMode, ...] = ("abort", "wait", "keep")
DEFAULT_VERSION = "default"  # what vLLM's GET /weight_info says before any update
DRAIN_TIMEOUT_S = 600.0  # how long /pause waits for calls in flight to finish or freeze


class WeightUpdateError(EngineError):
    """A weight-sync request the engine refuses; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message, param)
        self.status = status


class PauseGate:
    """Admission of model calls and their token boundaries, for ``/pause`` and ``/resume``.

    Thread-safe: calls run on worker threads. A call is *admitted* for its whole generation and
    passes :meth:`checkpoint` before each token."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.paused = False
        self.mode: PauseMode | None = None
        self._running = 0  # admitted calls
        self._frozen = 0  # admitted calls waiting at a checkpoint (keep)

    @contextlib.contextmanager
    def admitted(self) -> Iterator[Callable[[], None]]:
        """Wait while paused, then count the call in until it ends; yields its checkpoint."""
        with self._cond:
            while self.paused:
                self._cond.wait()
            self._running += 1
        try:
            yield self.checkpoint
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def checkpoint(self) -> None:
        """Between two tokens: go on, freeze until resumed (keep) or raise :class:`Aborted`."""
        if not self.paused:  # the common case, without the lock
            return
        with self._cond:
            if self.paused and self.mode == "keep":
                self._frozen += 1
                self._cond.notify_all()
                try:
                    while self.paused and self.mode == "keep":
                        self._cond.wait()
                finally:
                    self._frozen -= 1
            if self.paused and self.mode == "abort":
                raise Aborted

    def pause(self, mode: PauseMode, timeout_s: float = DRAIN_TIMEOUT_S) -> None:
        """Pause, and return once no call is computing: aborted or finished (abort, wait), or
        frozen (keep)."""
        with self._cond:
            self.paused, self.mode = True, mode
            self._cond.notify_all()
            drained = self._cond.wait_for(
                (lambda: self._running == self._frozen)
                if mode == "keep"
                else (lambda: self._running == 0),
                timeout_s,
            )
        if not drained:
            raise WeightUpdateError(
                f"pause(mode={mode}): calls in flight did not {'freeze' if mode == 'keep' else 'end'} "
                f"within {timeout_s:g} s (the engine stays paused: /resume to go on)",
                status=504,
            )

    def resume(self) -> None:
        """Let frozen and waiting calls go on."""
        with self._cond:
            self.paused, self.mode = False, None
            self._cond.notify_all()

    @contextlib.contextmanager
    def holding_frozen(self) -> Iterator[bool]:
        """True when paused with ``keep`` and calls are frozen at a token boundary, every
        admitted one of them (none computing; the frozen one holds the model, so nothing else
        computes either), and then nothing can resume them until the block ends: the weights
        may change under them. With no call frozen the swap takes the model as usual."""
        with self._cond:
            yield (
                self.paused
                and self.mode == "keep"
                and self._frozen > 0
                and self._running == self._frozen
            )


def confined(path_text: Any, roots: list[Path]) -> Path:
    """An update's checkpoint folder: absolute, existing, and inside one of ``roots`` (after
    symlinks and ``..``), or a :class:`WeightUpdateError` that says which rule it broke."""
    if not isinstance(path_text, str) or not path_text:
        raise WeightUpdateError("update_info.path must be a non-empty string", param="path")
    if not os.path.isabs(path_text):
        raise WeightUpdateError(
            f"update_info.path must be an absolute folder, got {path_text!r}", param="path"
        )
    if not roots:
        raise WeightUpdateError(
            "this engine takes no checkpoint folders: start it with --weights-root DIR "
            "(or send the tensors as update_info.safetensors)",
            status=403,
            param="path",
        )
    path = Path(path_text).resolve()
    if not any(path == r or path.is_relative_to(r) for r in roots):
        raise WeightUpdateError(
            f"update_info.path {path_text!r} is outside the engine's weights roots "
            f"{[str(r) for r in roots]}",
            status=403,
            param="path",
        )
    if not path.is_dir():
        raise WeightUpdateError(f"update_info.path {path_text!r} is not a folder", param="path")
    return path


class WeightUpdates:
    """The engine's weight version and its update session (vLLM's RL routes, as state).

    Every method blocks (reads files, copies tensors): the server runs them on worker threads.
    One control operation runs at a time."""

    def __init__(self, model: EngineModel, *, roots: list[Path] | None = None) -> None:
        self.model = model
        self.roots = [Path(r).resolve() for r in roots or []]
        self.gate = PauseGate()
        self.version: str = DEFAULT_VERSION
        self._staged: dict[str, Any] | None = None  # name -> tensor, while a session is open
        self._lock = threading.Lock()

    def _served(self) -> dict[str, TensorSpec]:
        # A backend with fixed weights (llama.cpp) refuses here, naming what would take them.
        return self.model.weight_specs()

    def init_transfer(self, init_info: Any) -> None:
        """``/init_weight_transfer_engine``: the CPU transfers need no rendezvous; the info must
        be an object (vLLM's shape)."""
        if not isinstance(init_info, dict):
            raise WeightUpdateError("init_info must be a JSON object", param="init_info")
        self._served()

    def start(self) -> None:
        """``/start_weight_update``: open a session (one at a time)."""
        self._served()
        with self._lock:
            if self._staged is not None:
                raise WeightUpdateError(
                    "a weight update is already under way: finish it (/finish_weight_update) first",
                    status=409,
                )
            self._staged = {}

    def _abort(self) -> None:
        self._staged = None

    def stage(self, update_info: Any) -> int:
        """``/update_weights``: read one chunk, check it, stage it; returns how many tensors it
        held. Any problem ends the session (the served weights are untouched)."""
        served = self._served()
        with self._lock:
            if self._staged is None:
                raise WeightUpdateError(
                    "no weight update is under way: /start_weight_update first", status=409
                )
            try:
                tensors = self._read(update_info, served)
                again = sorted(set(tensors) & set(self._staged))
                if again:
                    raise WeightUpdateError(
                        f"tensor(s) sent twice in one update: {again[:5]}", param="update_info"
                    )
            except BaseException:
                self._abort()
                raise
            self._staged.update(tensors)
            return len(tensors)

    def _read(self, update_info: Any, served: dict[str, TensorSpec]) -> dict[str, Any]:
        if not isinstance(update_info, dict):
            raise WeightUpdateError("update_info must be a JSON object", param="update_info")
        kinds = [k for k in ("path", "safetensors") if k in update_info]
        if len(kinds) != 1 or set(update_info) - {"path", "safetensors"}:
            raise WeightUpdateError(
                "update_info takes exactly one of 'path' (a checkpoint folder on this machine) "
                f"or 'safetensors' (base64 of a safetensors file); got keys {sorted(update_info)}",
                param="update_info",
            )
        try:
            if kinds == ["path"]:
                folder = confined(update_info["path"], self.roots)
                files = sorted(set(folder_tensors(folder).values()))
                specs: dict[str, TensorSpec] = {}
                for file in files:
                    specs.update(file_tensors(file))
                _check(served, specs, where=str(folder))
                out: dict[str, Any] = {}
                for file in files:
                    out.update(self.model.read_tensors(file))
                return out
            blob = _b64(update_info["safetensors"])
            specs = parse_header(blob, size=len(blob), where="update_info.safetensors")
            _check(served, specs, where="update_info.safetensors")
            return self.model.read_tensors(blob)
        except CheckpointError as exc:
            raise WeightUpdateError(str(exc), param="update_info") from None

    def finish(self, weight_version: Any = None) -> None:
        """``/finish_weight_update``: check the staged set is complete, swap it in between two
        model calls (or under calls frozen by a keep pause), then set the version if given."""
        if weight_version is not None and not isinstance(weight_version, str):
            raise WeightUpdateError("weight_version must be a string", param="weight_version")
        served = self._served()
        with self._lock:
            if self._staged is None:
                raise WeightUpdateError(
                    "no weight update is under way: /start_weight_update first", status=409
                )
            staged, self._staged = self._staged, None
            if not staged:
                raise WeightUpdateError(
                    "the update held no tensors (send them with /update_weights): nothing changed"
                )
            missing = mismatches(served, {n: served[n] for n in staged}, complete=True)
            if missing:
                raise WeightUpdateError(
                    f"the update is incomplete, nothing changed: {summary(missing)}",
                    param="update_info",
                )
            started = time.perf_counter()
            with self.gate.holding_frozen() as frozen:
                if frozen:  # every call waits at a token boundary: none computes
                    self.model.swap_weights(staged)
            if not frozen:
                with self.model.lock():  # between two model calls
                    self.model.swap_weights(staged)
            if weight_version is not None:
                self.version = weight_version
            log.info(
                "weights swapped in (%d tensors, version %s) in %.3f s",
                len(staged), self.version, time.perf_counter() - started,
            )  # fmt: skip

    def set_version(self, new_version: Any) -> str:
        """``/update_weight_version``."""
        if not isinstance(new_version, str) or not new_version:
            raise WeightUpdateError("new_version must be a non-empty string", param="new_version")
        self.version = new_version
        return new_version

    def checksums(self) -> dict[str, str]:
        """SHA-256 of each served tensor's bytes, as vLLM's ``/weight_checker`` reports them."""
        self._served()
        with self.model.lock():
            return self.model.weight_checksums()

    def reset(self) -> None:
        """Randomise every served tensor (vLLM's ``reset``: a sync can then be verified by
        checksum). Keyed, like every route that changes weights."""
        self._served()
        with self._lock, self.model.lock():
            self.model.randomize_weights()


def _check(served: dict[str, TensorSpec], given: dict[str, TensorSpec], *, where: str) -> None:
    problems = mismatches(served, given, complete=False)
    if problems:
        raise WeightUpdateError(
            f"{where} does not fit the served model, nothing changed: {summary(problems)}",
            param="update_info",
        )


def _b64(value: Any) -> bytes:
    if not isinstance(value, str) or not value:
        raise WeightUpdateError(
            "update_info.safetensors must be a base64 string", param="safetensors"
        )
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise WeightUpdateError(
            f"update_info.safetensors is not base64: {exc}", param="safetensors"
        ) from None
