"""Safetensors checkpoints, read without torch: each tensor's name, kind and shape, and the
checks that a checkpoint fits a served model.

A weight update that loads the wrong tensors does not crash: it serves a broken policy (vLLM
0.32 given a bad folder was left half-loaded and died on the next call, ``FACTS.md``). So a
checkpoint is checked against what is served before a single weight moves: every tensor
present, nothing unknown, every shape and kind right. The header of a safetensors file says all
of that (an 8-byte length, then JSON), so the reference engine (before it loads the bytes) and
the TRL client (before it asks vLLM to reload a folder) read the same table here.

A base module: imports nothing of rollwire.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Bytes per element of each safetensors dtype (the format's own names).
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip
FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the format's own limit


class CheckpointError(ValueError):
    """A checkpoint that must not be served; the message names where and what is wrong."""


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as a checkpoint declares it: its dtype (safetensors' name) and shape."""

    dtype: str
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def parse_header(head: bytes, *, size: int, where: str) -> dict[str, TensorSpec]:
    """The tensor table of a safetensors blob whose first bytes are ``head`` and whose whole
    length is ``size``: every entry checked (known dtype, whole shape, its bytes inside the
    blob and as many as dtype x shape need)."""
    if len(head) < 8:
        raise CheckpointError(f"{where}: too short to be a safetensors file")
    (n,) = struct.unpack("<Q", head[:8])
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise CheckpointError(f"{where}: not a safetensors file (header length {n})")
    if len(head) < 8 + n:
        raise CheckpointError(f"{where}: the header is cut off")
    try:
        table = json.loads(head[8 : 8 + n])
    except ValueError as exc:
        raise CheckpointError(f"{where}: the header is not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise CheckpointError(f"{where}: the header is not a JSON object")
    data = size - 8 - n
    out: dict[str, TensorSpec] = {}
    for name, entry in table.items():
        if name == "__metadata__":
            continue
        dtype = entry.get("dtype") if isinstance(entry, dict) else None
        shape = entry.get("shape") if isinstance(entry, dict) else None
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if dtype not in DTYPE_BYTES:
            raise CheckpointError(f"{where}: tensor {name!r} has an unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise CheckpointError(f"{where}: tensor {name!r} has a malformed shape {shape!r}")
        spec = TensorSpec(dtype, tuple(shape))
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data
            or offsets[1] - offsets[0] != _numel(spec.shape) * DTYPE_BYTES[dtype]
        ):
            raise CheckpointError(
                f"{where}: tensor {name!r} ({spec}) has data offsets {offsets!r} that do not "
                f"fit it in the file's {data} data bytes (truncated or damaged)"
            )
        out[name] = spec
    return out


def file_tensors(path: Path) -> dict[str, TensorSpec]:
    """The tensor table of one ``.safetensors`` file (its header only is read)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) == 8:
            (n,) = struct.unpack("<Q", head)
            if n <= MAX_HEADER_BYTES:
                head += f.read(n)
    return parse_header(head, size=size, where=str(path))


def folder_tensors(folder: Path) -> dict[str, Path]:
    """Which file of a checkpoint folder holds each tensor (every ``*.safetensors`` in it); a
    folder without any, or a tensor in two files, is refused."""
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder")
    files = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors" and p.is_file())
    if not files:
        raise CheckpointError(f"{folder}: no .safetensors file in it")
    where: dict[str, Path] = {}
    for path in files:
        for name in file_tensors(path):
            if name in where:
                raise CheckpointError(
                    f"{folder}: tensor {name!r} is in both {where[name].name} and {path.name}"
                )
            where[name] = path
    return where


def folder_specs(folder: Path) -> dict[str, TensorSpec]:
    """Every tensor of a checkpoint folder with its spec."""
    out: dict[str, TensorSpec] = {}
    for path in sorted(set(folder_tensors(folder).values())):
        out.update(file_tensors(path))
    return out


def mismatches(
    served: Mapping[str, TensorSpec], given: Mapping[str, TensorSpec], *, complete: bool = True
) -> list[str]:
    """What keeps ``given`` from replacing ``served``, one line per problem (empty: it fits).

    A name the served model does not have, a shape that differs, a float given for an integer
    tensor (or the reverse); with ``complete``, a served tensor that is missing. A float
    tensor may come in another float dtype (it is cast to the served one)."""
    problems: list[str] = []
    for name, spec in given.items():
        want = served.get(name)
        if want is None:
            problems.append(f"unexpected tensor {name!r} ({spec}): the served model has none")
        elif spec.shape != want.shape:
            problems.append(
                f"tensor {name!r} has shape {list(spec.shape)}, served {list(want.shape)}"
            )
        elif (spec.dtype in FLOAT_DTYPES) != (want.dtype in FLOAT_DTYPES) or (
            spec.dtype not in FLOAT_DTYPES and spec.dtype != want.dtype
        ):
            problems.append(f"tensor {name!r} is {spec.dtype}, served {want.dtype}")
    if complete:
        missing = sorted(set(served) - set(given))
        if missing:
            shown = ", ".join(repr(m) for m in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            problems.append(f"{len(missing)} served tensor(s) missing: {shown}{more}")
    return problems


def summary(problems: list[str], limit: int = 5) -> str:
    """Problems as one line (the first ``limit``, then how many more)."""
    shown = "; ".join(problems[:limit])
    return shown + (f"; and {len(problems) - limit} more" if len(problems) > limit else "")
