"""Thin, checked access to the CUDA driver API through ``cuda.bindings.driver``.

``cuda.bindings`` returns ``(CUresult, *values)`` tuples; :func:`check` turns a failure into a
:class:`CudaError` that keeps the call, the error name and whether it poisons the context.
Everything imports ``cuda.bindings.driver`` lazily so that importing the record or replay
layer never needs libcuda.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from r3tui.errors import GpuUnavailable

if TYPE_CHECKING:
    import numpy as np

# Errors after which the context is unusable: every later call fails the same way, so the
# worker process that saw one has to be replaced (CUDA programming guide, "sticky" errors).
_STICKY_ERRORS = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        "CUDA_ERROR_UNKNOWN",
        "CUDA_ERROR_TENSOR_MEMORY_LEAK",
    }
)


class CudaError(RuntimeError):
    """A driver call failed."""

    def __init__(self, call: str, code: int, name: str, text: str) -> None:
        super().__init__(f"{call} failed: {name} ({text})")
        self.call = call
        self.code = code
        self.name = name
        self.text = text

    @property
    def sticky(self) -> bool:
        """True when the context is poisoned and the process must be replaced."""
        return self.name in _STICKY_ERRORS


@functools.cache
def driver() -> Any:
    """The ``cuda.bindings.driver`` module, imported on first use."""
    from cuda.bindings import driver as drv

    return drv


def check(result: Any, call: str) -> Any:
    """Unpack a ``cuda.bindings`` result tuple, raising :class:`CudaError` on failure.

    Returns ``None`` for calls with no outputs, the value for one, a tuple for several.
    """
    drv = driver()
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != drv.CUresult.CUDA_SUCCESS:
        raise error_from(err, call)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values


def error_from(err: Any, call: str) -> CudaError:
    drv = driver()
    name_res = drv.cuGetErrorName(err)
    text_res = drv.cuGetErrorString(err)
    name = name_res[1].decode() if name_res[0] == drv.CUresult.CUDA_SUCCESS else str(err)
    text = text_res[1].decode() if text_res[0] == drv.CUresult.CUDA_SUCCESS else ""
    return CudaError(call, int(err), name, text)


def init_device(device: int = 0) -> Any:
    """``cuInit`` and the ``CUdevice`` for ``device``; :class:`GpuUnavailable` if there is none."""
    try:
        drv = driver()
        check(drv.cuInit(0), "cuInit")
        count = check(drv.cuDeviceGetCount(), "cuDeviceGetCount")
    except CudaError as exc:
        raise GpuUnavailable(f"no usable CUDA device: {exc}") from exc
    except Exception as exc:  # libcuda missing: cuda.pathfinder raises its own error type
        raise GpuUnavailable(
            f"no usable CUDA device: libcuda cannot be loaded ({type(exc).__name__})",
            hint="run this on a GPU node with the NVIDIA driver installed",
        ) from exc
    if device >= int(count):
        raise GpuUnavailable(f"CUDA device {device} requested but only {count} present")
    return check(drv.cuDeviceGet(device), "cuDeviceGet")


def device_count() -> int:
    """The CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applied);
    :class:`GpuUnavailable` if there is none or no driver."""
    init_device(0)
    return int(check(driver().cuDeviceGetCount(), "cuDeviceGetCount"))


def current_context() -> Any | None:
    drv = driver()
    ctx = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    return ctx if ctx is not None and int(ctx) != 0 else None


class PrimaryContext:
    """The device's primary context, retained and made current (what pycuda.autoprimaryctx uses)."""

    def __init__(self, device: int = 0) -> None:
        drv = driver()
        self.device_ordinal = device
        self.device = init_device(device)
        self.context = check(drv.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        check(drv.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            drv = driver()
            drv.cuDevicePrimaryCtxRelease(self.device)


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    compute_capability: tuple[int, int]
    l2_bytes: int
    sm_count: int
    driver_version: int
    total_memory: int
    # The launch limits in r3tui.search.DeviceLimits' JSON form, with the shared-memory
    # opt-in limit (what cuFuncSetAttribute can raise a kernel's dynamic shared memory to).
    limits: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.name,
            "compute_capability": f"{self.compute_capability[0]}.{self.compute_capability[1]}",
            "l2_bytes": self.l2_bytes,
            "sm_count": self.sm_count,
            "driver_version": self.driver_version,
            "total_memory": self.total_memory,
        }


def device_info(device: Any) -> DeviceInfo:
    drv = driver()
    attr = drv.CUdevice_attribute

    def get(a: Any) -> int:
        return int(check(drv.cuDeviceGetAttribute(a, device), "cuDeviceGetAttribute"))

    raw_name = check(drv.cuDeviceGetName(256, device), "cuDeviceGetName")
    name = bytes(raw_name).split(b"\0", 1)[0].decode(errors="replace")
    return DeviceInfo(
        name=name,
        compute_capability=(
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        l2_bytes=get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        driver_version=int(check(drv.cuDriverGetVersion(), "cuDriverGetVersion")),
        total_memory=int(check(drv.cuDeviceTotalMem(device), "cuDeviceTotalMem")),
        limits={
            "max_threads_per_block": get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
            "max_block_dims": [get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
                               get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                               get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)],
            "max_shared_per_block": get(
                attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
            "max_threads_per_sm": get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
            "warp_size": get(attr.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
            "sm_count": get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        },
    )


def param_layout(function: Any) -> list[tuple[int, int]]:
    """``(offset, size)`` of every kernel parameter, from ``cuFuncGetParamInfo``."""
    drv = driver()
    layout: list[tuple[int, int]] = []
    while True:
        result = drv.cuFuncGetParamInfo(function, len(layout))
        if result[0] != drv.CUresult.CUDA_SUCCESS:
            # INVALID_VALUE marks the end of the parameter list; anything else is real.
            if result[0] == drv.CUresult.CUDA_ERROR_INVALID_VALUE:
                return layout
            raise error_from(result[0], "cuFuncGetParamInfo")
        layout.append((int(result[1]), int(result[2])))


class KernelParams:
    """A ``void**`` array pointing into one host copy of the packed argument bytes.

    ``cuLaunchKernel`` copies the values at launch time, so one instance can be reused for
    every launch of a candidate.
    """

    def __init__(self, arg_bytes: bytes, layout: list[tuple[int, int]]) -> None:
        import numpy as np

        end = max((off + size for off, size in layout), default=0)
        if end > len(arg_bytes):
            raise ValueError(
                f"the kernel's parameters need {end} bytes but the recording holds "
                f"{len(arg_bytes)}"
            )
        # 16-byte aligned storage: parameters of vector types are read with aligned loads.
        self._storage: np.ndarray = np.zeros(max(len(arg_bytes), 1) + 16, dtype=np.uint8)
        shift = (-self._storage.ctypes.data) % 16
        self._buf = self._storage[shift : shift + max(len(arg_bytes), 1)]
        self._buf[: len(arg_bytes)] = np.frombuffer(arg_bytes, dtype=np.uint8)
        base = self._buf.ctypes.data
        self._ptrs: np.ndarray = np.array([base + off for off, _ in layout], dtype=np.uint64)
        self.count = len(layout)

    @property
    def address(self) -> int:
        """The ``void**`` to pass as ``kernelParams`` (0 for a kernel without parameters)."""
        return int(self._ptrs.ctypes.data) if self.count else 0


def launch(
    function: Any,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem_bytes: int,
    stream: Any,
    params: KernelParams,
    cooperative: bool = False,
) -> None:
    """Launch a kernel; ``cooperative``: as cuLaunchCooperativeKernel (every block resident
    at once, so the grid may synchronize; a grid too large for that fails to launch)."""
    drv = driver()
    if cooperative:
        check(drv.cuLaunchCooperativeKernel(function, *grid, *block, shared_mem_bytes, stream,
                                            params.address),
              "cuLaunchCooperativeKernel")
        return
    check(
        drv.cuLaunchKernel(
            function, *grid, *block, shared_mem_bytes, stream, params.address, 0
        ),
        "cuLaunchKernel",
    )


def copy_to_host(address: int, size: int) -> bytes:
    """Device memory at ``address`` as bytes (synchronous)."""
    import numpy as np

    drv = driver()
    out = np.empty(size, dtype=np.uint8)
    if size:
        check(drv.cuMemcpyDtoH(out.ctypes.data, address, size), "cuMemcpyDtoH")
    return out.tobytes()


def copy_to_device(address: int, data: bytes | np.ndarray) -> None:
    import numpy as np

    drv = driver()
    arr = np.ascontiguousarray(np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes)
                               else data.view(np.uint8).reshape(-1))
    if arr.size:
        check(drv.cuMemcpyHtoD(address, arr.ctypes.data, arr.size), "cuMemcpyHtoD")


def load_module(image: bytes) -> Any:
    drv = driver()
    return check(drv.cuModuleLoadData(image), "cuModuleLoadData")


def get_function(module: Any, name: str) -> Any:
    drv = driver()
    return check(drv.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")


def function_attribute(function: Any, attr_name: str) -> int:
    drv = driver()
    attr = getattr(drv.CUfunction_attribute, attr_name)
    return int(check(drv.cuFuncGetAttribute(attr, function), "cuFuncGetAttribute"))


def allow_dynamic_shared(function: Any, nbytes: int) -> None:
    """Raise a kernel's dynamic shared memory limit where it needs more than the 48 KiB default."""
    if nbytes <= 48 * 1024:
        return
    drv = driver()
    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(drv.cuFuncSetAttribute(function, attr, nbytes), "cuFuncSetAttribute")


def set_cache_split(function: Any, cache_config: int | None, carveout: int | None) -> None:
    """Give a kernel the L1/shared-memory split an application asked for
    (``cuFuncSetCacheConfig`` with a ``CUfunc_cache`` value, the preferred carveout in
    percent); None leaves the driver's default."""
    drv = driver()
    if cache_config is not None:
        check(drv.cuFuncSetCacheConfig(function, drv.CUfunc_cache(cache_config)),
              "cuFuncSetCacheConfig")
    if carveout is not None:
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        check(drv.cuFuncSetAttribute(function, attr, carveout), "cuFuncSetAttribute")


def module_global(module: Any, name: str) -> tuple[int, int] | None:
    """``(address, size)`` of a ``__device__``/``__constant__`` variable, or None if absent."""
    drv = driver()
    result = drv.cuModuleGetGlobal(module, name.encode())
    if result[0] != drv.CUresult.CUDA_SUCCESS:
        return None
    return int(result[1]), int(result[2])
