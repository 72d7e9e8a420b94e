"""pytest setup for gemvx: the ``gpu`` marker, a per-test random generator, shared helpers.

GPU tests carry ``@pytest.mark.gpu``; they are skipped, with the reason, when CuPy cannot be
imported or when ``gemvx.gpu_available()`` is False. The check runs only when GPU tests were
collected, so a CPU-only run never imports CuPy.
"""

from __future__ import annotations

import functools
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

# tests/helpers.py is imported as ``helpers`` whatever the import mode.
sys.path.insert(0, str(Path(__file__).parent))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and CuPy (skipped cleanly without them)")


@functools.lru_cache(maxsize=None)
def gpu_skip_reason() -> str | None:
    """Why GPU tests cannot run here, or None when they can."""
    try:
        import cupy  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    import gemvx

    if not gemvx.gpu_available():
        return "no CUDA GPU visible (gemvx.gpu_available() is False)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    reason = gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A fresh generator per test, seeded from the test's node id (failures reproduce)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
