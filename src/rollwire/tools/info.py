"""What this machine can run: sandboxes, harnesses, datasets, env families (and an endpoint).

Shared by ``rollwire info`` and the MCP ``info`` tool; read-only, boots nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from rollwire.capture.certify import validate_llm


async def info_report(
    *,
    llm_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    datasets: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The report as plain JSON-ready data (``rollwire info --json`` prints exactly this)."""
    from rollwire.harnesses.envs.registry import list_tasks
    from rollwire.harnesses.harbor.datasets import DatasetError, resolve_dataset
    from rollwire.harnesses.harbor.sandboxes import available_sandboxes
    from rollwire.harnesses.harbor.seams import SEAMS, available_harnesses, served_dialects

    report: dict[str, Any] = {}
    if llm_url:
        cert = await validate_llm(llm_url, model=model, api_key=api_key)
        report["endpoint"] = cert.model_dump(mode="json")
    sandboxes = await anyio.to_thread.run_sync(available_sandboxes)
    report["sandboxes"] = [s.model_dump(mode="json") for s in sandboxes]
    report["harnesses"] = [
        {
            "name": n,
            "available": ok,
            "reason": why,
            "dialect": SEAMS[n].dialect if n in SEAMS else None,
        }
        for n, ok, why in available_harnesses()
    ]
    report["dialects"] = sorted(served_dialects())
    found = []
    bundled = ["examples/tasks"] if await anyio.Path("examples/tasks").is_dir() else []
    for source in datasets or bundled:
        try:
            ds = resolve_dataset(source)
            found.append(
                {
                    "source": source,
                    "name": ds.name,
                    "tasks": len(ds.tasks),
                    "skipped": list(ds.skipped),
                }
            )
        except DatasetError as exc:
            found.append({"source": source, "error": str(exc)})
    report["datasets"] = found
    listing = await anyio.to_thread.run_sync(list_tasks)  # imports every adapter: off the loop
    families: dict[str, Any] = {}
    for t in listing.tasks:
        families[t.family] = families.get(t.family, 0) + 1
    report["env_families"] = {
        **{f: {"available": True, "tasks": n} for f, n in families.items()},
        **{f: {"available": False, "reason": why} for f, why in listing.unavailable.items()},
    }
    return report
