"""GPU tests: skipped, with the reason, unless cuda.bindings finds a usable CUDA device.

Every test here is marked ``gpu``; this conftest adds the skip so that a CPU-only CI run
reports them as skipped rather than failing at import or at the first driver call.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNELS = Path(__file__).resolve().parent / "kernels"


@functools.cache
def gpu_unusable() -> str | None:
    """Why no CUDA device can be used here, or None when one can."""
    try:
        from cuda.bindings import driver
    except Exception as exc:
        return f"cuda.bindings is not importable: {exc}"
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return f"cuInit failed: {err.name}"
        err, count = driver.cuDeviceGetCount()
    except Exception as exc:  # libcuda missing: cuda.pathfinder raises its own error
        return f"no CUDA driver: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    if err != driver.CUresult.CUDA_SUCCESS or count < 1:
        return "no CUDA device"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_unusable()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU: {reason}")
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def catalog() -> ModuleType:
    spec = importlib.util.spec_from_file_location("r3_examples_catalog",
                                                  REPO / "examples" / "catalog.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["r3_examples_catalog"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Bundles recorded during this session, by name (filled lazily by the tests)."""
    return {}


@pytest.fixture(scope="session")
def axpy_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel

    out = tmp_path_factory.mktemp("axpy") / "bundle"
    record_kernel(RecordKernelRequest(
        source_path=KERNELS / "axpy.cu", kernel_name="axpy",
        inputs_path=KERNELS / "axpy_inputs.py", out=out, seed=3,
    ))
    return out
