"""What this machine can run: sandboxes, harnesses, datasets, env families (and an endpoint).

Shared by ``rollwire info`` and the MCP ``info`` tool; read-only, boots nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from rollwire.capture.certify import validate_llm
from rollwire.extras import install_hint
from rollwire.roots import BUNDLED_TASKS

#: where a report says Harbor is missing: the harbor extra is not installed
HARBOR_EXTRA = install_hint("harbor")


async def info_report(
    *,
    llm_url: str | None = None,
    model: str | None = None,
    api_key: str | None = None,
    datasets: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The report as plain JSON-ready data (``rollwire info --json`` prints exactly this).

    Every part reports what is missing rather than failing: without the harbor extra,
    ``harbor`` says so and there are no sandboxes, harnesses or datasets; without an env
    family's packages, the family is unavailable with the reason."""
    from rollwire.harnesses.envs.registry import list_tasks

    report: dict[str, Any] = {}
    if llm_url:
        cert = await validate_llm(llm_url, model=model, api_key=api_key)
        report["endpoint"] = cert.model_dump(mode="json")
    # A clone's examples/tasks as the user would type it; else the copy the installed package holds.
    if await anyio.Path("examples/tasks").is_dir():
        bundled = ["examples/tasks"]
    else:
        bundled = [str(BUNDLED_TASKS)] if await anyio.Path(BUNDLED_TASKS).is_dir() else []
    try:
        import harbor  # noqa: F401  (the harbor extra; its modules below import it)
    except ImportError as exc:
        missing = f"Harbor is not installed ({exc}); {HARBOR_EXTRA}"
        report["harbor"] = {"available": False, "reason": missing}
        report |= {"sandboxes": [], "harnesses": [], "dialects": []}
        report["datasets"] = [{"source": s, "error": missing} for s in datasets or bundled]
    else:
        report["harbor"] = {"available": True, "reason": None}
        report |= await _harbor_report(datasets or bundled)
    listing = await anyio.to_thread.run_sync(list_tasks)  # imports every adapter: off the loop
    families: dict[str, Any] = {}
    for t in listing.tasks:
        families[t.family] = families.get(t.family, 0) + 1
    report["env_families"] = {
        **{f: {"available": True, "tasks": n} for f, n in families.items()},
        **{f: {"available": False, "reason": why} for f, why in listing.unavailable.items()},
    }
    return report


async def _harbor_report(sources: Sequence[str]) -> dict[str, Any]:
    """Sandboxes, harnesses, the proxy's dialects and ``sources`` resolved as datasets."""
    from rollwire.harnesses.harbor.datasets import DatasetError, resolve_dataset
    from rollwire.harnesses.harbor.sandboxes import available_sandboxes
    from rollwire.harnesses.harbor.seams import SEAMS, available_harnesses, served_dialects

    sandboxes = await anyio.to_thread.run_sync(available_sandboxes)
    found = []
    for source in sources:
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
    return {
        "sandboxes": [s.model_dump(mode="json") for s in sandboxes],
        "harnesses": [
            {
                "name": n,
                "available": ok,
                "reason": why,
                "dialect": SEAMS[n].dialect if n in SEAMS else None,
            }
            for n, ok, why in available_harnesses()
        ],
        "dialects": sorted(served_dialects()),
        "datasets": found,
    }
