"""The standalone recorder: ``r3 record kernel SOURCE.cu --kernel NAME --inputs gen.py``.

Loads the inputs file by path, places every buffer and pointer table in the fixed-address
arena, checks the spec against the kernel's own parameter layout (``cuFuncGetParamInfo``),
snapshots the prologue, launches the original once, snapshots the epilogue, times the
original the way replay times candidates, checks that a second run reproduces the epilogue,
and writes the bundle.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from r3tui import __version__
from r3tui.errors import ConfigError, RecordingError
from r3tui.record.bundle import Bundle, BundleWriter
from r3tui.record.layout import (
    check_signature,
    device_global_names,
    pack_params,
    plan_allocations,
)
from r3tui.record.manifest import (
    AllocationInfo,
    ArenaInfo,
    BinaryImage,
    GlobalInfo,
    KernelInfo,
    LaunchInfo,
    Manifest,
    SourceFile,
    assemble_arg_bytes,
)
from r3tui.record.spec import KernelInputs

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RecordKernelRequest:
    """Everything ``r3 record kernel`` needs."""

    source_path: Path
    kernel_name: str
    inputs_path: Path
    out: Path
    seed: int = 0
    scale: float = 1.0
    options: tuple[str, ...] = ()
    toolchain: str = "nvrtc"
    device: int = 0
    baseline_samples: int = 20  # timed launches of the original
    overwrite: bool = False
    extra_provenance: dict[str, Any] = field(default_factory=dict)


def load_inputs(path: Path, seed: int, scale: float = 1.0) -> KernelInputs:
    """Import an inputs file by path and call its ``make_inputs``."""
    if not path.is_file():
        raise ConfigError(f"inputs file {path} does not exist")
    name = f"r3_inputs_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load inputs file {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses defined there look their module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"inputs file {path} fails to import: {type(exc).__name__}: {exc}"
                          ) from exc
    make = getattr(module, "make_inputs", None)
    if not callable(make):
        raise ConfigError(f"inputs file {path} defines no make_inputs(rng)")
    rng = np.random.default_rng(seed)
    try:
        inputs = make(rng, scale) if scale != 1.0 else make(rng)
    except Exception as exc:
        raise ConfigError(f"{path}: make_inputs failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(inputs, KernelInputs):
        raise ConfigError(f"{path}: make_inputs returned {type(inputs).__name__}, "
                          "not KernelInputs")
    return inputs


def record_kernel(req: RecordKernelRequest, progress: Progress | None = None) -> Bundle:
    """Record one launch of ``req.kernel_name``; returns the committed bundle."""
    from r3tui.compile.base import CompileRequest, first_error_line, get_toolchain
    from r3tui.record import cuda_driver as cu
    from r3tui.record.arena import ALIGNMENT, Arena
    from r3tui.replay.timing import EventTimer, L2Flush, TimingPolicy, time_launches
    from r3tui.replay.verify import compare_host

    say = progress or (lambda _msg: None)
    if not req.source_path.is_file():
        raise ConfigError(f"kernel source {req.source_path} does not exist")
    source = req.source_path.read_text(encoding="utf-8")
    say("generating inputs")
    inputs = load_inputs(req.inputs_path, req.seed, req.scale)
    plans = plan_allocations(inputs)

    say("reserving the arena")
    ctx = cu.PrimaryContext(req.device)
    info = cu.device_info(ctx.device)
    need = sum((p.size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT for p in plans) + ALIGNMENT
    arena = Arena(need, device=req.device)
    module = None
    cleanup: list[Callable[[], None]] = []
    try:
        say(f"compiling {req.kernel_name} with {req.toolchain}")
        compiled = get_toolchain(req.toolchain).compile(CompileRequest(
            source=source, kernel_name=req.kernel_name, arch=info.arch, options=req.options,
            defines=tuple(sorted(inputs.defines.items())),
            include_dirs=(str(req.source_path.parent.resolve()),),
            source_name=req.source_path.name,
        ))
        if not compiled.ok or compiled.binary is None or compiled.lowered_name is None:
            raise RecordingError(f"{req.source_path}: the kernel does not compile with "
                                 f"{req.toolchain}: {first_error_line(compiled.log)}")
        module = cu.load_module(compiled.binary)
        function = cu.get_function(module, compiled.lowered_name)
        layout = cu.param_layout(function)
        check_signature(inputs, layout, req.kernel_name)

        say("copying inputs to the GPU")
        blocks = {p.name: arena.allocate(p.size, p.name) for p in plans}
        addresses = {name: b.address for name, b in blocks.items()}
        for p in plans:
            cu.copy_to_device(addresses[p.name], p.contents(addresses))
        params = pack_params(inputs, layout, addresses)
        arg_bytes = assemble_arg_bytes(params)
        globals_found = {}
        for name in device_global_names(source):
            found = cu.module_global(module, name)
            if found is not None:
                globals_found[name] = found
        prologue = {n: cu.copy_to_host(b.address, b.size) for n, b in blocks.items()}
        g_prologue = {n: cu.copy_to_host(a, s) for n, (a, s) in globals_found.items()}

        grid, block = inputs.launch_grid(), inputs.block
        kparams = cu.KernelParams(arg_bytes, layout)
        cu.allow_dynamic_shared(function, inputs.shared_mem_bytes)
        drv = cu.driver()
        stream = cu.check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING),
                          "cuStreamCreate")
        cleanup.append(lambda: drv.cuStreamDestroy(stream))

        def launch() -> None:
            cu.launch(function, grid.as_tuple(), block.as_tuple(), inputs.shared_mem_bytes,
                      stream, kparams)

        say("running the original")
        try:
            launch()
            cu.check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        except cu.CudaError as exc:
            raise RecordingError(f"the original {req.kernel_name} failed on the GPU: {exc}"
                                 ) from exc
        epilogue = {n: cu.copy_to_host(b.address, b.size) for n, b in blocks.items()}
        g_epilogue = {n: cu.copy_to_host(a, s) for n, (a, s) in globals_found.items()}

        say("timing the original")
        extent = arena.top
        pristine = int(cu.check(drv.cuMemAlloc(max(extent, 256)), "cuMemAlloc"))
        cleanup.append(lambda: drv.cuMemFree(pristine))
        for n, b in blocks.items():
            cu.copy_to_device(pristine + b.address - arena.base, prologue[n])
        flush = L2Flush(info.l2_bytes, stream) \
            if sum(p.size for p in plans) < 2 * info.l2_bytes else None
        if flush is not None:
            cleanup.append(flush.close)
        timer = EventTimer(stream)
        cleanup.append(timer.close)

        def restore() -> None:
            cu.check(drv.cuMemcpyDtoDAsync(arena.base, pristine, extent, stream),
                     "cuMemcpyDtoDAsync")
            for n, (address, _s) in globals_found.items():
                data = g_prologue[n]
                cu.check(drv.cuMemcpyHtoDAsync(address, data, len(data), stream),
                         "cuMemcpyHtoDAsync")
            if flush is not None:
                flush()

        policy = TimingPolicy(min_samples=min(5, req.baseline_samples),
                              max_samples=req.baseline_samples, max_seconds=1.0)
        baseline = time_launches(launch, restore, timer, policy)

        # A second run must give the same epilogue, or replay could never verify a candidate:
        # a kernel with float atomics needs a tolerance on the buffers it writes.
        restore()
        launch()
        cu.check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
        for p in plans:
            again = cu.copy_to_host(blocks[p.name].address, blocks[p.name].size)
            result = compare_host(again, epilogue[p.name], p.tolerance, p.dtype, buffer=p.name)
            if not result.passed:
                raise RecordingError(
                    f"the original {req.kernel_name} is not deterministic: a second run "
                    f"changed {result.describe()}",
                    hint="declare a Tolerance for that buffer in the inputs file",
                )

        say("writing the bundle")
        with BundleWriter(req.out, overwrite=req.overwrite) as writer:
            src_sha = writer.add_blob(source.encode("utf-8"))
            bin_sha = writer.add_blob(compiled.binary)
            allocations = tuple(
                AllocationInfo(
                    name=p.name, address=addresses[p.name], size=p.size,
                    prologue=writer.add_blob(prologue[p.name]),
                    epilogue=writer.add_blob(epilogue[p.name]),
                    tolerance=p.tolerance, dtype=p.dtype, shape=p.shape,
                ) for p in plans
            )
            globals_ = tuple(
                GlobalInfo(n, s, writer.add_blob(g_prologue[n]), writer.add_blob(g_epilogue[n]))
                for n, (_a, s) in globals_found.items()
            )
            manifest = Manifest(
                kernel=KernelInfo(
                    name=req.kernel_name, entry_point=compiled.lowered_name,
                    sources=(SourceFile(req.source_path.name, src_sha),),
                    toolchain=compiled.toolchain, toolchain_version=compiled.toolchain_version,
                    options=tuple(req.options), defines=tuple(sorted(inputs.defines.items())),
                    binary=BinaryImage(bin_sha, compiled.binary_kind, info.arch),
                ),
                launch=LaunchInfo(
                    grid=grid, block=block, shared_mem_bytes=inputs.shared_mem_bytes,
                    work=inputs.work, block_tunable=inputs.block_tunable, count=1,
                    total_time_s=baseline.median_s, baseline=baseline,
                ),
                params=params,
                allocations=allocations,
                globals=globals_,
                arena=ArenaInfo(arena.base, arena.used),
                recorded_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                blobs=dict(writer.blobs),
                provenance={
                    **info.to_json(),
                    "recorder": "r3 record kernel",
                    "r3_version": __version__,
                    "cuda_bindings": _cuda_bindings_version(),
                    "host": platform.node(),
                    "seed": req.seed,
                    "scale": req.scale,
                    "inputs_file": req.inputs_path.name,
                    **req.extra_provenance,
                },
            )
            return writer.commit(manifest)
    finally:
        for step in reversed(cleanup):
            step()
        if module is not None:
            cu.driver().cuModuleUnload(module)
        arena.close()
        ctx.release()


def _cuda_bindings_version() -> str:
    try:
        from importlib.metadata import version

        return version("cuda-bindings")
    except Exception:
        return "unknown"
