"""Shared test configuration: async tests run on anyio's pytest plugin (asyncio backend)."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
