"""The torch engine's fixtures: the converted folder (``converted_dir``, tests/conftest.py) served
by the real :class:`~rollwire.engine.hf.HFModel` (load ~10 s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollwire.engine.server import create_engine_app
from tests.conftest import SERVED
from tests.fakes.serve import serve_in_thread


@pytest.fixture(scope="session")
def hf_model(converted_dir: Path) -> Any:
    from rollwire.engine.hf import HFModel

    return HFModel(converted_dir, n_ctx=4096)


@pytest.fixture(scope="session")
def hf_engine_url(hf_model: Any) -> Iterator[str]:
    with serve_in_thread(create_engine_app(hf_model, served_name=SERVED)) as url:
        yield url
