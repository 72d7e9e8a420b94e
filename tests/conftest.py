"""pytest setup for gemvx: the ``gpu`` marker, a per-test random generator, shared helpers.

GPU tests carry ``@pytest.mark.gpu``; they are skipped, with the reason, when CuPy cannot be
imported or when ``gemvx.gpu_available()`` is False. Tests of the JAX door carry
``@pytest.mark.gpu(door="jax")`` instead: they need JAX with a GPU backend, not CuPy. The checks
run only when GPU tests were collected, so a CPU-only run never imports CuPy.
"""

from __future__ import annotations

import functools
import os
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

# tests/helpers.py is imported as ``helpers`` whatever the import mode.
sys.path.insert(0, str(Path(__file__).parent))


# JAX would otherwise reserve most of the GPU's memory when its backend starts, leaving little for
# the CuPy tests of the same session (it must be set before JAX initialises a backend).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# On GPUs, the sharded tests' all-reduces go through NCCL: keep its NVLink multicast (NVLS) off,
# it can take shared GPUs out of service.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

# test_jax_sharded.py partitions calls over up to 8 devices; on the CPU, XLA makes that many host
# devices when asked before JAX starts its CPU backend (other backends are not affected, and
# every other test uses one device). A count already in XLA_FLAGS is left as it is.
HOST_DEVICES = 8
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(
        f for f in (os.environ.get("XLA_FLAGS", ""),
                    f"--xla_force_host_platform_device_count={HOST_DEVICES}") if f)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "gpu(door='cupy'): needs a CUDA GPU and CuPy, or with door='jax' a CUDA GPU and "
        "JAX with a GPU backend (skipped cleanly without them)")


@functools.lru_cache(maxsize=None)
def gpu_skip_reason(door: str = "cupy") -> str | None:
    """Why GPU tests of ``door`` ("cupy" or "jax") cannot run here, or None when they can."""
    if door == "jax":
        try:
            import jax
        except Exception as exc:  # noqa: BLE001 - ImportError, or a broken CUDA plugin
            return f"JAX is not importable ({type(exc).__name__}: {exc})"
        try:
            backend = jax.default_backend()
            cuda = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
        except Exception as exc:  # noqa: BLE001 - a GPU plugin that fails to initialise
            return f"JAX cannot start a backend ({type(exc).__name__}: {exc})"
        if backend != "gpu" or not cuda:
            return (f"JAX has no GPU backend (jax.default_backend() is {backend!r}); "
                    "install jax with CUDA support (e.g. pip install 'jax[cuda13]')")
    else:
        try:
            import cupy  # noqa: F401
        except Exception as exc:  # ImportError, or a CUDA library that fails to load
            return f"CuPy is not importable ({type(exc).__name__}: {exc})"
    import gemvx

    if not gemvx.gpu_available():
        return "no CUDA GPU visible (gemvx.gpu_available() is False)"
    return None


def pytest_report_header(config: pytest.Config) -> str:
    """Which gemvx is under test: where it was imported from and what it was built with."""
    try:
        import gemvx
    except Exception as exc:  # noqa: BLE001 - reported here; the tests fail on the import
        return f"gemvx: not importable ({type(exc).__name__}: {exc})"
    info = gemvx.build_info()
    return (f"gemvx {gemvx.__version__} from {Path(gemvx.__file__).parent} (CUDA architectures "
            f"{info.get('cuda_architectures')}, JAX FFI headers of jaxlib {info.get('jaxlib') or 'none'}"
            f", XLA FFI API {info.get('xla_ffi_api') or 'none'})")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        reason = gpu_skip_reason(marker.kwargs.get("door", "cupy"))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def table_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A user table directory ($GEMVX_TABLE_DIR) for the test, with gemvx's table caches cleared
    around it."""
    from gemvx import _table

    user = tmp_path / "user_tables"
    user.mkdir()
    monkeypatch.setenv("GEMVX_TABLE_DIR", str(user))
    _table.table_for.cache_clear()
    _table._select_cached.cache_clear()
    yield user
    _table.table_for.cache_clear()
    _table._select_cached.cache_clear()


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A fresh generator per test, seeded from the test's node id (failures reproduce)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
