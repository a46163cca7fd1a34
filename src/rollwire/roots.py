"""Where a client may point the server: every path it names resolves inside declared roots.

The MCP server's clients name paths (collection directories, Harbor datasets in task
references and ``list_tasks`` sources, push sources); only the operator names the roots, on the
command line: ``--data-dir`` (collections; datasets may live there too), ``--dataset-root``
(repeatable) and, by default, the bundled example tasks. A path is resolved first (``..`` and
symlinks followed) and must then lie inside a root; anything else is refused with a
:class:`OutsideRoots` naming the field. The CLI's own commands are the operator's and are not
confined.

A base module (the bottom layer): imports nothing of rollwire; any layer may import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: the example tasks as an installed wheel carries them (pyproject.toml's force-include)
PACKAGED_TASKS = Path(__file__).resolve().parent / "example_tasks"
#: the example tasks that ship with rollwire: inside the installed package, else a source
#: checkout's ``examples/tasks``
BUNDLED_TASKS = (
    PACKAGED_TASKS
    if PACKAGED_TASKS.is_dir()
    else Path(__file__).resolve().parents[2] / "examples" / "tasks"
)


class OutsideRoots(ValueError):
    """A client-named path that resolves outside every declared root; names the field."""


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


@dataclass(frozen=True)
class Roots:
    """The operator's roots: collections under ``data_dir``; datasets under any root."""

    data_dir: Path
    datasets: tuple[Path, ...] = ()
    bundled: bool = True

    def dataset_roots(self) -> tuple[Path, ...]:
        roots = [self.data_dir, *self.datasets]
        if self.bundled and BUNDLED_TASKS.is_dir():
            roots.append(BUNDLED_TASKS)
        return tuple(dict.fromkeys(r.expanduser().resolve() for r in roots))

    def dataset(self, field: str, source: str | Path) -> Path:
        """``source`` (relative to the working directory, as the runner reads it) resolved,
        if it lies inside a dataset root; else :class:`OutsideRoots` naming ``field``."""
        path = Path(source).expanduser().resolve()
        roots = self.dataset_roots()
        if not any(_inside(path, root) for root in roots):
            raise OutsideRoots(
                f"{field}: {str(source)!r} resolves to {path}, which is outside the dataset roots "
                f"this server declares ({', '.join(map(str, roots))}); the operator adds roots "
                "with --dataset-root"
            )
        return path

    def task_paths(self, field: str, source: str, paths: Iterable[Path]) -> None:
        """Every task directory a dataset (e.g. a registry JSON) points at must be inside a
        root too; else :class:`OutsideRoots` naming ``field`` and the task."""
        roots = self.dataset_roots()
        for task in paths:
            resolved = Path(task).expanduser().resolve()
            if not any(_inside(resolved, root) for root in roots):
                raise OutsideRoots(
                    f"{field}: dataset {source!r} points at task directory {resolved}, which is "
                    "outside the dataset roots this server declares; the operator adds roots "
                    "with --dataset-root"
                )

    def collection(self, field: str, out_dir: str) -> Path:
        """Where a collection named ``out_dir`` lives: always strictly inside ``data_dir``.
        Relative names are taken under it; an absolute path must already be inside it."""
        root = self.data_dir.expanduser().resolve()
        given = Path(out_dir).expanduser()
        path = (given if given.is_absolute() else root / given).resolve()
        if root not in path.parents:
            raise OutsideRoots(
                f"{field}: {out_dir!r} resolves to {path}, which is not inside the data "
                f"directory {root} (--data-dir): name a directory inside it"
            )
        return path
