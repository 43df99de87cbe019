"""Compilation layer of R³: kernel source -> cubin for one exact arch, with its resource usage.

- :mod:`~r3tui.compile.base`: :class:`CompileRequest`, :class:`CompiledKernel`, the
  :class:`Toolchain` interface, :func:`get_toolchain`, :func:`cache_key`, :func:`dedupe`.
- :mod:`~r3tui.compile.nvrtc` (default, in-process) and :mod:`~r3tui.compile.nvcc` (subprocess).
- :mod:`~r3tui.compile.options`: the accepted options and their canonical spelling
  (:func:`accepted_options` is what the search space is built from).
- :mod:`~r3tui.compile.cache` (:class:`CompileCache`) and :mod:`~r3tui.compile.pool`
  (:class:`CompilePool`, one compiler process per core).
- :mod:`~r3tui.compile.cubin` and :mod:`~r3tui.compile.resources`: registers, spills, stack and
  shared memory from the ptxas report and the cubin's ELF.

Importing this package imports no ``cuda.*`` module; NVRTC loads on the first compile.
"""

from r3tui.compile.base import (
    CompiledKernel,
    CompileRequest,
    Toolchain,
    cache_key,
    dedupe,
    get_toolchain,
)
from r3tui.compile.cache import CompileCache, default_cache_dir
from r3tui.compile.nvrtc import DriverCompat, check_driver_compat, nvrtc_version
from r3tui.compile.options import OptionSpec, accepted_options, canonicalize
from r3tui.compile.pool import CompilePool

__all__ = [
    "CompileCache",
    "CompilePool",
    "CompileRequest",
    "CompiledKernel",
    "DriverCompat",
    "OptionSpec",
    "Toolchain",
    "accepted_options",
    "cache_key",
    "canonicalize",
    "check_driver_compat",
    "dedupe",
    "default_cache_dir",
    "get_toolchain",
    "nvrtc_version",
]
