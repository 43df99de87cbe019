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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from r3tui import __version__
from r3tui.errors import ConfigError, RecordingError
from r3tui.record.bundle import Bundle, BundleWriter
from r3tui.record.layout import (
    PlannedAllocation,
    check_signature,
    device_global_names,
    pack_params,
    plan_allocations,
)
from r3tui.record.manifest import (
    AllocationInfo,
    ArenaInfo,
    BinaryImage,
    CheckLaunch,
    GlobalInfo,
    KernelInfo,
    LaunchInfo,
    Manifest,
    ParamInfo,
    SourceFile,
    assemble_arg_bytes,
)
from r3tui.record.spec import KernelInputs

if TYPE_CHECKING:
    from r3tui.cuda.arena import ArenaBlock

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
    # Check launches (docs/verification.md): the generator with seed+k at scale*check_scale**k;
    # candidates are verified on them too, never timed there.
    checks: int = 1
    check_scale: float = 0.125
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


@dataclass
class _Launch:
    """One input set placed in the arena, and what the original made of it."""

    label: str
    inputs: KernelInputs
    plans: list[PlannedAllocation]
    blocks: dict[str, ArenaBlock]
    params: tuple[ParamInfo, ...]
    kparams: Any
    prologue: dict[str, bytes]
    epilogue: dict[str, bytes] = field(default_factory=dict)
    g_epilogue: dict[str, bytes] = field(default_factory=dict)


def record_kernel(req: RecordKernelRequest, progress: Progress | None = None) -> Bundle:
    """Record one launch of ``req.kernel_name`` (and its check launches); returns the bundle."""
    from r3tui.compile.base import CompileRequest, first_error_line, get_toolchain
    from r3tui.cuda import driver as cu
    from r3tui.cuda.arena import ALIGNMENT, Arena
    from r3tui.replay.timing import EventTimer, L2Flush, TimingPolicy, time_launches
    from r3tui.replay.verify import compare_host

    say = progress or (lambda _msg: None)
    if not req.source_path.is_file():
        raise ConfigError(f"kernel source {req.source_path} does not exist")
    source = req.source_path.read_text(encoding="utf-8")
    say("generating inputs")
    inputs = load_inputs(req.inputs_path, req.seed, req.scale)
    check_sets = _check_inputs(req, inputs, say)
    plans = plan_allocations(inputs)
    check_plans = [plan_allocations(c) for _label, c in check_sets]

    say("reserving the arena")
    ctx = cu.PrimaryContext(req.device)
    info = cu.device_info(ctx.device)
    need = sum((p.size + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
               for ps in [plans, *check_plans] for p in ps) + ALIGNMENT
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

        def place(label: str, spec: KernelInputs, planned: list[PlannedAllocation]) -> _Launch:
            check_signature(spec, layout, req.kernel_name)
            blocks = {p.name: arena.allocate(p.size, p.name) for p in planned}
            addresses = {name: b.address for name, b in blocks.items()}
            for p in planned:
                cu.copy_to_device(addresses[p.name], p.contents(addresses))
            params = pack_params(spec, layout, addresses)
            return _Launch(label, spec, planned, blocks, params,
                           cu.KernelParams(assemble_arg_bytes(params), layout),
                           {n: cu.copy_to_host(b.address, b.size) for n, b in blocks.items()})

        main = place("recorded", inputs, plans)
        checks = [place(label, spec, planned)
                  for (label, spec), planned in zip(check_sets, check_plans, strict=True)]
        globals_found = {}
        for name in device_global_names(source):
            found = cu.module_global(module, name)
            if found is not None:
                globals_found[name] = found
        g_prologue = {n: cu.copy_to_host(a, s) for n, (a, s) in globals_found.items()}

        drv = cu.driver()
        stream = cu.check(drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING),
                          "cuStreamCreate")
        cleanup.append(lambda: drv.cuStreamDestroy(stream))

        def launcher(case: _Launch) -> Callable[[], None]:
            spec = case.inputs
            cu.allow_dynamic_shared(function, spec.shared_mem_bytes)
            return lambda: cu.launch(function, spec.launch_grid().as_tuple(),
                                     spec.block.as_tuple(), spec.shared_mem_bytes, stream,
                                     case.kparams)

        def reset_globals() -> None:
            for n, (address, _s) in globals_found.items():
                data = g_prologue[n]
                cu.check(drv.cuMemcpyHtoDAsync(address, data, len(data), stream),
                         "cuMemcpyHtoDAsync")

        def run(case: _Launch) -> None:
            reset_globals()
            try:
                launcher(case)()
                cu.check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
            except cu.CudaError as exc:
                raise RecordingError(f"the original {req.kernel_name} failed on the GPU "
                                     f"({case.label} inputs): {exc}") from exc
            case.epilogue = {n: cu.copy_to_host(b.address, b.size)
                             for n, b in case.blocks.items()}
            case.g_epilogue = {n: cu.copy_to_host(a, s) for n, (a, s) in globals_found.items()}

        say("running the original")
        for case in [main, *checks]:
            run(case)

        say("timing the original")
        extent = arena.top
        pristine = int(cu.check(drv.cuMemAlloc(max(extent, 256)), "cuMemAlloc"))
        cleanup.append(lambda: drv.cuMemFree(pristine))
        for case in [main, *checks]:
            for n, b in case.blocks.items():
                cu.copy_to_device(pristine + b.address - arena.base, case.prologue[n])
        flush = L2Flush(info.l2_bytes, stream) \
            if sum(p.size for p in plans) < 2 * info.l2_bytes else None
        if flush is not None:
            cleanup.append(flush.close)
        timer = EventTimer(stream)
        cleanup.append(timer.close)

        def restore() -> None:
            cu.check(drv.cuMemcpyDtoDAsync(arena.base, pristine, extent, stream),
                     "cuMemcpyDtoDAsync")
            reset_globals()
            if flush is not None:
                flush()

        launch = launcher(main)
        policy = TimingPolicy(min_samples=min(5, req.baseline_samples),
                              max_samples=req.baseline_samples, max_seconds=1.0)
        baseline = time_launches(launch, restore, timer, policy)

        # A second run must give the same epilogue, or replay could never verify a candidate:
        # a kernel with float atomics needs a tolerance on the buffers it writes.
        for case in [main, *checks]:
            restore()
            launcher(case)()
            cu.check(drv.cuStreamSynchronize(stream), "cuStreamSynchronize")
            for p in case.plans:
                block = case.blocks[p.name]
                again = cu.copy_to_host(block.address, block.size)
                result = compare_host(again, case.epilogue[p.name], p.tolerance, p.dtype,
                                      buffer=p.name)
                if not result.passed:
                    raise RecordingError(
                        f"the original {req.kernel_name} is not deterministic: a second run "
                        f"({case.label} inputs) changed {result.describe()}",
                        hint="declare a Tolerance for that buffer in the inputs file",
                    )

        say("writing the bundle")
        with BundleWriter(req.out, overwrite=req.overwrite) as writer:
            src_sha = writer.add_blob(source.encode("utf-8"))
            bin_sha = writer.add_blob(compiled.binary)

            def allocations_of(case: _Launch) -> tuple[AllocationInfo, ...]:
                return tuple(
                    AllocationInfo(
                        name=p.name, address=case.blocks[p.name].address, size=p.size,
                        prologue=writer.add_blob(case.prologue[p.name]),
                        epilogue=writer.add_blob(case.epilogue[p.name]),
                        tolerance=p.tolerance, dtype=p.dtype, shape=p.shape,
                    ) for p in case.plans
                )

            def globals_of(case: _Launch) -> tuple[GlobalInfo, ...]:
                return tuple(
                    GlobalInfo(n, s, writer.add_blob(g_prologue[n]),
                               writer.add_blob(case.g_epilogue[n]))
                    for n, (_a, s) in globals_found.items()
                )

            def launch_info(spec: KernelInputs, **extra: Any) -> LaunchInfo:
                return LaunchInfo(grid=spec.launch_grid(), block=spec.block,
                                  shared_mem_bytes=spec.shared_mem_bytes, work=spec.work,
                                  block_tunable=spec.block_tunable, **extra)

            manifest = Manifest(
                kernel=KernelInfo(
                    name=req.kernel_name, entry_point=compiled.lowered_name,
                    sources=(SourceFile(req.source_path.name, src_sha),),
                    toolchain=compiled.toolchain, toolchain_version=compiled.toolchain_version,
                    options=tuple(req.options), defines=tuple(sorted(inputs.defines.items())),
                    binary=BinaryImage(bin_sha, compiled.binary_kind, info.arch),
                ),
                launch=launch_info(inputs, count=1, total_time_s=baseline.median_s,
                                   baseline=baseline),
                params=main.params,
                allocations=allocations_of(main),
                globals=globals_of(main),
                arena=ArenaInfo(arena.base, arena.used),
                recorded_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                blobs={},
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
                checks=tuple(
                    CheckLaunch(c.label, launch_info(c.inputs), c.params, allocations_of(c),
                                globals_of(c))
                    for c in checks
                ),
            )
            return writer.commit(replace(manifest, blobs=dict(writer.blobs)))
    finally:
        for step in reversed(cleanup):
            step()
        if module is not None:
            cu.driver().cuModuleUnload(module)
        arena.close()
        ctx.release()


def _check_inputs(req: RecordKernelRequest, inputs: KernelInputs,
                  say: Progress) -> list[tuple[str, KernelInputs]]:
    """The input sets of the check launches: the generator again, with other seeds and a
    smaller scale, so the sizes, the scalars and the data all differ from the recording."""
    out: list[tuple[str, KernelInputs]] = []
    for k in range(1, req.checks + 1):
        seed, scale = req.seed + k, req.scale * req.check_scale ** k
        other = load_inputs(req.inputs_path, seed, scale)
        label = f"seed {seed}, scale {scale:g}"
        if dict(other.defines) != dict(inputs.defines):
            # the defines are compiled into the module: another size would need another binary
            say(f"no check launch: the inputs' defines change with the size ({label})")
            return out
        out.append((label, other))
    return out


def _cuda_bindings_version() -> str:
    try:
        from importlib.metadata import version

        return version("cuda-bindings")
    except Exception:
        return "unknown"
