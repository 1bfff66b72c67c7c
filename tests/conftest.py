"""Shared fixtures (helpers for building tiny jobs live in tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Every async test runs on both backends unless it overrides this fixture."""
    return str(request.param)


@pytest.fixture(autouse=True)
def _small_torch() -> None:
    torch.set_num_threads(1)


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"
