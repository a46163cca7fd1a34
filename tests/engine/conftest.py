"""The torch engine's fixtures: the embedded GGUF converted once by ``rollwire convert`` itself,
served by the real :class:`~rollwire.engine.hf.HFModel` (conversion ~35 s, load ~10 s)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollwire.engine.server import create_engine_app
from rollwire.server.cli import main
from tests.conftest import SERVED
from tests.fakes.serve import serve_in_thread


@pytest.fixture(scope="session")
def converted_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded SmolLM2 GGUF as a Hugging Face folder, written by the CLI."""
    out = tmp_path_factory.mktemp("smollm2-hf")
    assert main(["convert", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def hf_model(converted_dir: Path) -> Any:
    from rollwire.engine.hf import HFModel

    return HFModel(converted_dir, n_ctx=4096)


@pytest.fixture(scope="session")
def hf_engine_url(hf_model: Any) -> Iterator[str]:
    with serve_in_thread(create_engine_app(hf_model, served_name=SERVED)) as url:
        yield url


@pytest.fixture(scope="session")
def hf_tokenizer(converted_dir: Path) -> Any:
    """The converted folder's tokenizer, loaded by plain transformers."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(converted_dir)
