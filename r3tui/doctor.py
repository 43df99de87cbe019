"""``r3 doctor``: what this node has, each line OK or missing with how to fix it.

Every probe is isolated: a probe that raises becomes a "missing" line with the error text,
so the doctor itself never fails with a traceback on a half-configured node.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from r3tui.config import Settings

# The install commands README.md gives (an editable install of a checkout)
INSTALL_LLM = "pip install -e '.[llm,model]'"
INSTALL_GPU = "pip install -e '.[gpu]'"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = False  # a required check that fails makes `r3 doctor` exit non-zero


def _python() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    ok = sys.version_info >= (3, 11)
    return Check("python", ok, version, "R³ needs Python 3.11 or newer", required=True)


def _database(db_path: Path) -> Check:
    from db.migrate import head_revision
    from db.session import open_database

    head = head_revision()
    if not db_path.exists():
        return Check(
            "database",
            True,
            f"{db_path} not created yet (schema head {head})",
            "`r3 db upgrade` creates it; any write command does too",
        )
    database = open_database(db_path, readonly=True, upgrade=False, one_shot=True)
    try:
        revision = database.revision()
    finally:
        database.close()
    if revision == head:
        return Check("database", True, f"{db_path} at revision {revision} (head)")
    return Check(
        "database",
        False,
        f"{db_path} at revision {revision}, this R³ expects {head}",
        f"run `r3 db upgrade --db {db_path}`",
    )


def _toolchain(name: str, required: bool) -> Check:
    from r3tui.compile.base import get_toolchain

    toolchain = get_toolchain(name)
    ok, message = toolchain.available()
    if ok:
        return Check(name, True, message, required=required)
    return Check(name, False, message, _TOOLCHAIN_FIX[name], required)


_TOOLCHAIN_FIX = {
    "nvrtc": "pip install cuda-bindings nvidia-cuda-nvrtc==13.0.88 (installed with r3tui)",
    "nvcc": "install the CUDA toolkit and put nvcc on PATH (optional: NVRTC is the default)",
    "llvm": "apt-get install clang-19 llvm-19 (optional: no pass-pipeline dimension without it)",
}


def _gpu_pycuda() -> Check:
    try:
        driver = importlib.import_module("pycuda.driver")
    except ImportError:
        return Check(
            "gpu (pycuda)",
            False,
            "pycuda is not installed",
            f"on a GPU node: {INSTALL_GPU} (needs the CUDA toolkit and driver)",
        )
    try:
        driver.init()
        device = driver.Device(0)
        major, minor = device.compute_capability()
        version = driver.get_driver_version()
        cuda = f"{version // 1000}.{version % 1000 // 10}"
        detail = f"{device.name()}, sm_{major}{minor}, driver CUDA {cuda}"
        return Check("gpu (pycuda)", True, detail)
    except Exception as exc:  # pycuda raises its own LogicError/RuntimeError family
        return Check("gpu (pycuda)", False, f"no usable GPU: {exc}", "run on a GPU node")


def _gpu_driver() -> Check:
    try:
        from cuda.bindings import driver
    except ImportError:
        return Check("gpu (driver)", False, "cuda-bindings missing", "pip install cuda-bindings")
    try:
        (err,) = driver.cuInit(0)
    except Exception as exc:  # cuda-bindings raises when libcuda.so itself is absent
        return Check(
            "gpu (driver)",
            False,
            f"libcuda not loadable ({type(exc).__name__}): no NVIDIA driver on this machine",
            "recording and replay need a GPU node; compiling and browsing work here",
        )
    if err != driver.CUresult.CUDA_SUCCESS:
        return Check(
            "gpu (driver)",
            False,
            f"cuInit failed: {err.name} (no libcuda or no GPU here)",
            "recording and replay need a GPU node; compiling and browsing work here",
        )
    _, count = driver.cuDeviceGetCount()
    _, version = driver.cuDriverGetVersion()
    return Check(
        "gpu (driver)",
        count > 0,
        f"{count} device(s), driver CUDA {version // 1000}.{version % 1000 // 10}",
        "no CUDA device visible",
    )


def _interposer() -> Check:
    from r3tui.record import interposer

    lib = interposer.build()
    how = "built now" if lib.built else "cached"
    return Check("app interposer", True, f"{lib.path} ({how}, {lib.compiler}, "
                 f"cuda.h from {lib.include_dir})")


def _llama() -> Check:
    try:
        module = importlib.import_module("llama_cpp")
    except ImportError:
        return Check("llama_cpp", False, "not installed", INSTALL_LLM)
    return Check("llama_cpp", True, f"llama-cpp-python {module.__version__}")


def _model(settings: Settings) -> Check:
    from r3tui.remix.models import bundled_model, resolve_model

    if settings.model.path is None and bundled_model() is None:
        return Check("model", False, "no language model found (or pass --model PATH.gguf, "
                     "or set R3_MODEL)", INSTALL_LLM)
    location = resolve_model(None, settings.model.path)
    size_mb = location.path.stat().st_size / 1e6
    return Check("model", True, f"{location.path} ({size_mb:.0f} MB, {location.origin})")


def run_checks(settings: Settings, db_path: Path) -> list[Check]:
    probes: list[tuple[str, Callable[[], Check], str, bool]] = [
        ("python", _python, "", True),
        ("database", lambda: _database(db_path), "check the path or remove a damaged file", True),
        ("nvrtc", lambda: _toolchain("nvrtc", True), _TOOLCHAIN_FIX["nvrtc"], True),
        ("nvcc", lambda: _toolchain("nvcc", False), _TOOLCHAIN_FIX["nvcc"], False),
        ("llvm", lambda: _toolchain("llvm", False), _TOOLCHAIN_FIX["llvm"], False),
        ("gpu (pycuda)", _gpu_pycuda, f"{INSTALL_GPU} on a GPU node", False),
        ("gpu (driver)", _gpu_driver, "run on a GPU node", False),
        ("app interposer", _interposer, "needs cc and cuda.h (for `r3 record -- ./app`)",
         False),
        ("llama_cpp", _llama, INSTALL_LLM, False),
        ("model", lambda: _model(settings), f"{INSTALL_LLM} or --model PATH.gguf", False),
    ]
    checks = []
    for name, probe, fix, required in probes:
        try:
            checks.append(probe())
        except Exception as exc:  # the doctor reports, it never crashes
            text = " ".join(str(exc).split()) or type(exc).__name__
            hint = getattr(exc, "hint", None)
            checks.append(Check(name, False, text, hint or fix, required))
    return without_repeated_fixes(checks)


def without_repeated_fixes(checks: list[Check]) -> list[Check]:
    """Each fix is shown once, on the first missing check it fixes; a later check that the
    same command fixes points back to it."""
    first: dict[str, str] = {}
    out = []
    for check in checks:
        if not check.ok and check.fix:
            if check.fix in first:
                check = replace(check, fix=f"fixed by the same command as {first[check.fix]}")
            else:
                first[check.fix] = check.name
        out.append(check)
    return out
