"""Record an unchanged PyCUDA program: ``with r3tui.record.capture(path): main()``.

Inside the block:

- ``pycuda.driver.mem_alloc`` -- and therefore ``gpuarray``, whose functions take
  ``allocator=drv.mem_alloc`` as a default bound at import time, so those defaults are
  patched too -- hands out memory from the fixed-address arena;
- every kernel launch goes through ``Function._launch_kernel`` (``__call__``,
  ``prepared_call``, ``prepared_timed_call`` and ``prepared_async_call`` all end there), which
  is wrapped: the first launch of each (kernel, grid, block, shared memory) snapshots every
  live arena allocation before and after and keeps the argument bytes; later ones are only
  counted and timed with CUDA events;
- ``SourceModule`` remembers its source and options and ``module_from_buffer`` its binary,
  so each bundle carries the kernel's source (as pycuda compiled it) and cubin.

On exit one bundle per launch configuration is written under ``path/`` with an
``index.json``.  pycuda is imported only when a capture starts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import struct
import sys
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r3tui import __version__
from r3tui.cuda.arena import DEFAULT_RESERVE, Arena, ArenaBlock
from r3tui.domain import Dim3, Tolerance
from r3tui.errors import RecordingError
from r3tui.record.bundle import Bundle, BundleWriter
from r3tui.record.layout import device_global_names, layout_from_buffer, params_from_bytes
from r3tui.record.manifest import (
    AllocationInfo,
    ArenaInfo,
    BinaryImage,
    GlobalInfo,
    KernelInfo,
    LaunchInfo,
    Manifest,
    ParamInfo,
    SourceFile,
)

INDEX_NAME = "index.json"
_EVENT_BATCH = 256  # pending event pairs before they are read (bounds memory, avoids stalls)
_PROCESS_ARENA: Arena | None = None  # the fixed range can be reserved once per process


class ArenaPointer(int):
    """A device address in the arena that pycuda accepts wherever it takes a DeviceAllocation.

    pycuda's C++ functions convert Python ints to ``CUdeviceptr`` and its kernel argument
    packer reads ``__cuda_array_interface__``; an ``int`` subclass with that property works
    for both.
    """

    block: ArenaBlock
    _arena: Arena

    def __new__(cls, block: ArenaBlock, arena: Arena) -> ArenaPointer:
        obj = super().__new__(cls, block.address)
        obj.block = block
        obj._arena = arena
        return obj

    def free(self) -> None:
        self._arena.free(self.block)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.block.size,), "typestr": "|u1", "data": (int(self), False),
                "version": 3}


@dataclass
class _Config:
    """One captured launch configuration and the bundle being written for it."""

    kernel: str
    grid: Dim3
    block: Dim3
    shared: int
    writer: BundleWriter
    image: bytes | None
    source: str | None
    options: tuple[str, ...]
    params: tuple[ParamInfo, ...]
    allocations: list[AllocationInfo]
    globals: list[GlobalInfo]
    extent: int
    count: int = 1
    time_s: float = 0.0
    events: list[tuple[Any, Any]] = field(default_factory=list)


class CaptureSession:
    """The state of one ``capture`` block; see the module docstring."""

    def __init__(self, path: Path, *, kernels: Collection[str] | None = None,
                 tolerance: Tolerance | None = None, dtype: str | None = None,
                 reserve: int = DEFAULT_RESERVE) -> None:
        self.path = path
        self.kernels = set(kernels) if kernels is not None else None
        self.tolerance, self.dtype = tolerance, dtype
        self.reserve = reserve
        self.configs: dict[tuple[object, ...], _Config] = {}
        self.warnings: list[str] = []
        self.bundles: list[Bundle] = []
        self.names: dict[int, tuple[str, Tolerance | None, str | None]] = {}
        self._undo: list[Callable[[], None]] = []
        self.arena: Arena

    # -- user hooks ----------------------------------------------------------------------
    def describe(self, obj: Any, name: str, *, tolerance: Tolerance | None = None,
                 dtype: str | None = None) -> None:
        """Optionally name an allocation (an ArenaPointer or a GPUArray) and its policy."""
        address = int(getattr(obj, "gpudata", obj))
        self.names[address] = (name, tolerance, dtype)

    # -- patching ------------------------------------------------------------------------
    def _patch(self, owner: Any, attr: str, value: Any) -> None:
        old = getattr(owner, attr)
        setattr(owner, attr, value)
        self._undo.append(lambda: setattr(owner, attr, old))

    def install(self) -> None:
        global _PROCESS_ARENA
        try:
            import pycuda.driver as drv
        except ImportError as exc:  # a user's environment, not a bug: one line, exit 2
            raise RecordingError(
                f"r3 record pycuda needs pycuda, which this Python cannot import ({exc})",
                hint="pip install pycuda where the CUDA toolkit is, or record the "
                     "program's launches with `r3 record -- ./app`") from None

        from r3tui.cuda import driver as cu

        cu.init_device(0)
        if cu.current_context() is None:
            # No pycuda context yet: use the primary one (what pycuda.autoprimaryctx uses).
            cu.PrimaryContext(0)
        device = int(cu.check(cu.driver().cuCtxGetDevice(), "cuCtxGetDevice"))
        if _PROCESS_ARENA is None:
            _PROCESS_ARENA = Arena(self.reserve, device=device)
        self.arena = _PROCESS_ARENA
        self.device = device
        orig_alloc = drv.mem_alloc

        def mem_alloc(nbytes: int) -> ArenaPointer:
            return ArenaPointer(self.arena.allocate(int(nbytes)), self.arena)

        # Module attributes (``from pycuda.driver import mem_alloc`` anywhere) and default
        # arguments bound at definition time (``allocator=drv.mem_alloc`` in gpuarray).
        for module in list(sys.modules.values()):
            try:
                items = list(vars(module).items())
            except TypeError:
                continue
            for name, value in items:
                if value is orig_alloc:
                    self._patch(module, name, mem_alloc)
                elif getattr(module, "__name__", "").startswith("pycuda"):
                    self._patch_defaults(value, orig_alloc, mem_alloc)

        orig_launch = drv.Function._launch_kernel

        def _launch_kernel(func: Any, grid: Any, block: Any, args: Any, shared: int,
                           stream: Any) -> Any:
            return self.on_launch(func, grid, block, args, shared, stream, orig_launch)

        self._patch(drv.Function, "_launch_kernel", _launch_kernel)
        orig_get_function = drv.Module.get_function

        def get_function(module: Any, name: str) -> Any:
            func = orig_get_function(module, name)
            func._r3_name = name
            func._r3_module = module
            return func

        self._patch(drv.Module, "get_function", get_function)
        orig_from_buffer = drv.module_from_buffer

        def module_from_buffer(buffer: Any, *args: Any, **kwargs: Any) -> Any:
            module = orig_from_buffer(buffer, *args, **kwargs)
            module._r3_image = bytes(buffer) if not isinstance(buffer, str) else buffer.encode()
            return module

        self._patch(drv, "module_from_buffer", module_from_buffer)
        self._patch_source_module()

    def _patch_defaults(self, obj: Any, old: Any, new: Any) -> None:
        targets = [obj]
        if isinstance(obj, type):
            targets = [v for v in vars(obj).values() if callable(v)]
        for fn in targets:
            defaults = getattr(fn, "__defaults__", None)
            if defaults and any(d is old for d in defaults):
                self._patch(fn, "__defaults__", tuple(new if d is old else d for d in defaults))

    def _patch_source_module(self) -> None:
        import pycuda.compiler as compiler

        orig_init = compiler.SourceModule.__init__

        def __init__(module: Any, source: str, nvcc: str = "nvcc", options: Any = None,
                     keep: bool = False, no_extern_c: bool = False, *args: Any,
                     **kwargs: Any) -> None:
            orig_init(module, source, nvcc, options, keep, no_extern_c, *args, **kwargs)
            # The text nvcc saw: pycuda wraps the source in extern "C" unless told not to.
            text = source if no_extern_c else 'extern "C" {\n' + source + '\n}\n'
            module.module._r3_source = text
            module.module._r3_options = tuple(options or ())

        self._patch(compiler.SourceModule, "__init__", __init__)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    # -- launches ------------------------------------------------------------------------
    def on_launch(self, func: Any, grid: Any, block: Any, args: Any, shared: int, stream: Any,
                  orig: Callable[..., Any]) -> Any:
        name = getattr(func, "_r3_name", None) or "unknown_kernel"
        if self.kernels is not None and name not in self.kernels:
            return orig(func, grid, block, args, shared, stream)
        import pycuda.driver as drv

        module = getattr(func, "_r3_module", None)
        image = getattr(module, "_r3_image", None)
        g, b = Dim3.of(tuple(grid)), Dim3.of(tuple(block))
        key = (name, hashlib.sha256(image).hexdigest() if image else id(module),
               g.as_tuple(), b.as_tuple(), int(shared))
        config = self.configs.get(key)
        if config is not None:
            start, end = drv.Event(), drv.Event()
            start.record(stream)
            result = orig(func, grid, block, args, shared, stream)
            end.record(stream)
            config.count += 1
            config.events.append((start, end))
            if len(config.events) >= _EVENT_BATCH:
                self._drain(config)
            return result
        return self._first_launch(key, (func, grid, block, args, shared, stream), name, module,
                                  image, g, b, orig)

    def _first_launch(self, key: tuple[object, ...], call: tuple[Any, ...], name: str,
                      module: Any, image: bytes | None, g: Dim3, b: Dim3,
                      orig: Callable[..., Any]) -> Any:
        import pycuda.driver as drv

        from r3tui.cuda import driver as cu

        drv.Context.synchronize()  # the application's queued work is part of the prologue
        live = self.arena.live_blocks()
        source = getattr(module, "_r3_source", None)
        global_ptrs: dict[str, tuple[int, int]] = {}
        if source is not None and module is not None:
            for gname in device_global_names(source):
                try:
                    ptr, size = module.get_global(gname)
                    global_ptrs[gname] = (int(ptr), int(size))
                except Exception:  # not a variable of this module after all
                    continue
        prologue = {blk.address: cu.copy_to_host(blk.address, blk.size) for blk in live}
        g_pro = {n: cu.copy_to_host(a, s) for n, (a, s) in global_ptrs.items()}
        args, shared, stream = call[3], call[4], call[5]
        start, end = drv.Event(), drv.Event()
        start.record(stream)
        result = orig(*call)
        end.record(stream)
        drv.Context.synchronize()
        elapsed = end.time_since(start) * 1e-3
        arg_bytes = bytes(args)

        index = len(self.configs)
        folder = self.path / f"{index:03d}-{name}-{'x'.join(map(str, g.as_tuple()))}-" \
                             f"{'x'.join(map(str, b.as_tuple()))}"
        writer = BundleWriter(folder, overwrite=True)
        allocations = []
        for i, blk in enumerate(live):
            label, tol, dtype = self.names.get(blk.address, (f"alloc{i}", self.tolerance,
                                                             self.dtype))
            allocations.append(AllocationInfo(
                name=label, address=blk.address, size=blk.size,
                prologue=writer.add_blob(prologue[blk.address]),
                epilogue=writer.add_blob(cu.copy_to_host(blk.address, blk.size)),
                tolerance=tol, dtype=dtype if tol is not None or dtype else None,
            ))
        globals_ = [GlobalInfo(n, s, writer.add_blob(g_pro[n]),
                               writer.add_blob(cu.copy_to_host(a, s)))
                    for n, (a, s) in global_ptrs.items()]
        by_address = {a.address: a.name for a in allocations}
        params = self._params(name, image, arg_bytes, by_address)
        self.configs[key] = _Config(
            kernel=name, grid=g, block=b, shared=int(shared), writer=writer, image=image,
            source=source, options=getattr(module, "_r3_options", ()), params=params,
            allocations=allocations, globals=globals_,
            extent=max((blk.end for blk in live), default=self.arena.base) - self.arena.base,
            time_s=elapsed,
        )
        return result

    def _params(self, name: str, image: bytes | None, arg_bytes: bytes,
                by_address: dict[int, str]) -> tuple[ParamInfo, ...]:
        from r3tui.cuda import driver as cu

        layout: list[tuple[int, int]] | None = None
        if image is not None:
            try:
                mod = cu.load_module(image)
                try:
                    layout = cu.param_layout(cu.get_function(mod, name))
                finally:
                    cu.driver().cuModuleUnload(mod)
            except cu.CudaError as exc:
                self.warnings.append(f"{name}: parameter layout unknown ({exc})")
        if layout is None:
            layout = layout_from_buffer(arg_bytes)

        def locate(address: int) -> tuple[str, int] | None:
            blk = self.arena.block_at(address)
            if blk is None or blk.address not in by_address:
                return None
            return by_address[blk.address], address - blk.address

        params = params_from_bytes(arg_bytes, layout, locate)
        for p in params:
            if p.kind.value == "bytes" and p.size == 8:
                value = struct.unpack("<Q", p.raw)[0]
                if value and _is_device_pointer(value):
                    self.warnings.append(
                        f"{name}: parameter {p.index} points to device memory outside the "
                        "arena (allocated before the capture began?); replay will not restore it"
                    )
        return params

    def _drain(self, config: _Config) -> None:
        if config.events:
            config.events[-1][1].synchronize()
            config.time_s += sum(e.time_since(s) * 1e-3 for s, e in config.events)
            config.events.clear()

    # -- output --------------------------------------------------------------------------
    def finish(self, *, failed: bool) -> list[Bundle]:
        import pycuda.driver as drv

        from r3tui.cuda import driver as cu

        if failed:
            for config in self.configs.values():
                config.writer.abort()
            return []
        drv.Context.synchronize()
        info = cu.device_info(cu.check(cu.driver().cuCtxGetDevice(), "cuCtxGetDevice"))
        entries = []
        for config in self.configs.values():
            self._drain(config)
            w = config.writer
            src_files: tuple[SourceFile, ...] = ()
            if config.source is not None:
                src_files = (SourceFile("kernel.cu", w.add_blob(config.source.encode())),)
            binary = None
            if config.image is not None:
                kind = "cubin" if config.image[:4] == b"\x7fELF" else "fatbin"
                binary = BinaryImage(w.add_blob(config.image), kind, info.arch)
            granularity = self.arena.granularity
            manifest = Manifest(
                kernel=KernelInfo(name=config.kernel, entry_point=config.kernel,
                                  sources=src_files, toolchain="nvcc" if config.source else None,
                                  options=config.options, binary=binary),
                launch=LaunchInfo(grid=config.grid, block=config.block,
                                  shared_mem_bytes=config.shared, count=config.count,
                                  total_time_s=config.time_s),
                params=config.params,
                allocations=tuple(config.allocations),
                globals=tuple(config.globals),
                arena=ArenaInfo(self.arena.base,
                                max(granularity, -(-config.extent // granularity) * granularity)),
                recorded_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                blobs=dict(w.blobs),
                provenance={**info.to_json(), "recorder": "pycuda capture",
                            "r3_version": __version__, "pycuda": _pycuda_version(),
                            "program": os.path.basename(sys.argv[0]) if sys.argv else None,
                            "warnings": list(self.warnings)},
            )
            bundle = w.commit(manifest)
            self.bundles.append(bundle)
            entries.append({"path": bundle.path.name, "sha256": bundle.sha256,
                            "kernel": config.kernel, "grid": list(config.grid.as_tuple()),
                            "block": list(config.block.as_tuple()),
                            "shared_mem_bytes": config.shared, "count": config.count,
                            "total_time_s": config.time_s})
        index = {"format_version": 1, "bundles": entries, "warnings": self.warnings}
        tmp = self.path / f".{INDEX_NAME}.tmp"
        tmp.write_text(json.dumps(index, indent=2) + "\n")
        os.replace(tmp, self.path / INDEX_NAME)
        return self.bundles


def _is_device_pointer(value: int) -> bool:
    from r3tui.cuda import driver as cu

    drv = cu.driver()
    attr = drv.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    return bool(drv.cuPointerGetAttribute(attr, value)[0] == drv.CUresult.CUDA_SUCCESS)


def _pycuda_version() -> str | None:
    try:
        import pycuda

        return str(pycuda.VERSION_TEXT)
    except Exception:
        return None


@contextmanager
def capture(path: str | os.PathLike[str], *, kernels: Collection[str] | None = None,
            tolerance: Tolerance | None = None, dtype: str | None = None,
            reserve: int = DEFAULT_RESERVE) -> Iterator[CaptureSession]:
    """Capture the PyCUDA launches inside the block into bundles under ``path``.

    ``kernels``: only these kernel names (default: all).  ``tolerance``/``dtype``: the
    verification policy of every captured allocation (default: exact bytes); name single
    allocations with :meth:`CaptureSession.describe`.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    session = CaptureSession(root, kernels=kernels, tolerance=tolerance, dtype=dtype,
                             reserve=reserve)
    session.install()
    failed = True
    try:
        yield session
        failed = False
    finally:
        session.uninstall()
        session.finish(failed=failed)


def record_script(out: Path, script: Path, args: Sequence[str],
                  kernels: Collection[str] | None = None) -> CaptureSession:
    """Run the PyCUDA program ``script``, unchanged, with ``args`` as its command line and
    :func:`capture` installed, into ``out`` (``r3 record pycuda``); the finished session holds
    the bundles it wrote and its warnings."""
    import runpy

    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    with capture(out, kernels=kernels) as session:
        runpy.run_path(str(script), run_name="__main__")
    return session
