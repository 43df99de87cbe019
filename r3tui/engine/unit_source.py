"""What a campaign compiles and edits for a recorded kernel, and the check that it works.

A kernel recorded from a standalone source (``r3 record kernel``) is searched on that source.
A kernel recorded inside an application sits in a unit with host code and application headers;
it is searched on its *device unit* (:func:`r3tui.analysis.device_unit.device_unit`): the
kernel and the device code it reaches, headers inlined, host code left out, so NVRTC compiles it
in tens of milliseconds where nvcc takes seconds for the whole unit (docs/device-unit.md).

:func:`preflight` compiles the original once before a search starts and picks the toolchain:
the one asked for when it compiles the original, else nvcc when NVRTC cannot (said in one
line); when neither can, the campaign must not start (:class:`OriginalUnusable`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.analysis.device_unit import DeviceUnit
    from r3tui.engine.inner import InnerSettings, KernelSource
    from r3tui.record.bundle import Bundle
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits


class OriginalUnusable(R3Error):
    """The recorded kernel's own source does not compile or replay: nothing to search from."""


@dataclass(frozen=True)
class SeedUnit:
    source: KernelSource  # what the search edits and compiles
    unit: DeviceUnit | None  # None: the recorded source as it is
    recorded_text: str  # the recorded unit as the bundle stores it

    def describe(self) -> str:
        if self.unit is None:
            return "the recorded source as it is"
        where = self.unit.file or "the recorded unit"
        left = len([d for d in self.unit.dropped if d.startswith("host function")])
        return (f"the device unit of {self.unit.kernel} (defined in {where}; "
                f"{left} host function(s) and {len(self.unit.dropped) - left} include(s) "
                "left out)")


def needs_device_unit(text: str, has_headers: bool) -> bool:
    """Whether ``text`` holds more than device code NVRTC compiles as it is: host functions,
    includes that are not device headers, or application headers."""
    from r3tui.analysis import ExecutionSpace, ItemKind, parse_translation_unit
    from r3tui.analysis.safety import is_device_header

    if has_headers:
        return True
    unit = parse_translation_unit(text)
    if any(i.kind is ItemKind.FUNCTION and i.space is ExecutionSpace.HOST for i in unit.items):
        return True
    return any(not is_device_header(i.target) for i in unit.includes)


def seed_unit(bundle: Bundle) -> SeedUnit:
    """The source a campaign on ``bundle`` starts from."""
    from pathlib import PurePosixPath

    from r3tui.analysis.device_unit import DeviceUnitError, device_unit
    from r3tui.compile.nvrtc import default_include_dirs
    from r3tui.engine.inner import KernelSource
    from r3tui.errors import RecordingError
    from r3tui.record.sources import qualified_name

    manifest = bundle.manifest
    text = bundle.source()
    if text is None:
        raise RecordingError(f"{bundle.path} holds no kernel source: nothing to compile")
    source = KernelSource(
        text,
        manifest.kernel.name,
        manifest.kernel.sources[0].name if manifest.kernel.sources else "kernel.cu",
        defines=manifest.kernel.defines,
        include_dirs=bundle.include_dirs(),  # the application headers the bundle carries
    )
    headers = bundle.header_texts()
    forced = manifest.kernel.forced_includes
    if not forced and not needs_device_unit(text, bool(headers)):
        return SeedUnit(source, None, text)
    wanted = qualified_name(manifest.kernel.entry_point)
    base = wanted.name if wanted is not None else manifest.kernel.name.split("<")[0]
    scopes = None
    if wanted is not None and manifest.kernel.entry_point.startswith("_Z"):
        scopes = [s.replace("(anonymous namespace)", "(anonymous)") for s in wanted.scopes]
    include_dirs = [str(PurePosixPath(d)) for d in manifest.kernel.include_dirs] or ["."]
    try:
        unit = device_unit(text, base, headers, include_dirs,
                           cuda_include_dirs=default_include_dirs(), scopes=scopes,
                           forced=forced)
    except DeviceUnitError as exc:
        raise RecordingError(f"{bundle.path}: {exc}") from exc
    return SeedUnit(replace(source, text=unit.text, confined=True), unit, text)


def searched_launch(bundle: Bundle, seed: SeedUnit) -> tuple[LaunchInfo, str | None]:
    """The launch a campaign on ``bundle`` searches, and why its block stays as recorded.

    In an application the host code chooses the block; ``r3 apply`` ships another shape
    through the ``#ifndef``-guarded macro its launches take it from
    (:func:`r3tui.engine.splice.block_macro`), else by rewriting each ``<<<grid, block>>>``
    launch to the tuned block and the grid that covers the same threads
    (:func:`r3tui.engine.splice.reshape_reason`).  Where it can do neither (a launch through
    ``cudaLaunchKernel``, dynamic shared memory the host may size from the block), a
    searched shape could never ship (and its tuned launch bounds would not fit the launches
    that do), so the block is kept."""
    from r3tui.engine.splice import block_macro, reshape_reason

    launch = bundle.manifest.launch
    recorder = (bundle.manifest.provenance or {}).get("recorder")
    if not launch.block_tunable or recorder != "app interposer":
        return launch, None
    kernel = bundle.manifest.kernel.name
    if block_macro(seed.recorded_text, kernel) is not None:
        return launch, None
    reason = reshape_reason(seed.recorded_text, kernel)
    if reason is None:
        return launch, None
    x, y, z = launch.block.as_tuple()
    return replace(launch, block_tunable=False), (
        f"block {x}x{y}x{z} kept: the application's launches of this kernel do not take their "
        f"block size from an #ifndef-guarded macro, and r3 apply could not rewrite them: "
        f"{reason}")


def defining_file(bundle: Bundle, seed: SeedUnit) -> tuple[str, str] | None:
    """The name (header tree path, or the recorded unit's name) and recorded text of the file
    that defines an application's kernel (``seed`` is ``seed_unit(bundle)``); None when the
    campaign searches the recorded source itself (nothing to map back)."""
    if seed.unit is None:
        return None
    if seed.unit.file is None:
        sources = bundle.manifest.kernel.sources
        return (sources[0].name if sources else "kernel.cu"), seed.recorded_text
    return seed.unit.file, bundle.header_texts()[seed.unit.file]


@dataclass(frozen=True)
class Preflight:
    toolchain: str
    note: str | None  # why the toolchain differs from the one asked for
    seconds: float  # the compile that decided it


def preflight(source: KernelSource, toolchain: str, arch: str) -> Preflight:
    """Compile the original once with ``toolchain``, else with nvcc; raises
    :class:`OriginalUnusable` with the compiler's first error when neither compiles it."""
    from r3tui.compile.base import first_error_line, get_toolchain
    from r3tui.domain import TrialConfig
    from r3tui.engine.inner import compile_request

    tried: list[str] = []
    for name in dict.fromkeys((toolchain, "nvcc")):
        chain = get_toolchain(name)
        ok, why = chain.available()
        if not ok:
            tried.append(f"{name}: not available ({why})")
            continue
        request = compile_request(source, TrialConfig(toolchain=name), arch)
        compiled = chain.compile(request)
        if compiled.ok:
            note = None if name == toolchain else (
                f"{toolchain} cannot compile the original ({tried[0].split(': ', 1)[1]}); "
                f"searching with {name}")
            return Preflight(name, note, compiled.seconds)
        tried.append(f"{name}: {first_error_line(compiled.log)}")
    raise OriginalUnusable(
        "the original kernel does not compile, so there is nothing to search from: "
        + "; ".join(tried))


def compile_error(source: KernelSource, launch: LaunchInfo, inner: InnerSettings,
                  limits: DeviceLimits, arch: str) -> str | None:
    """The compiler's first error for ``source`` at the baseline configuration of its own
    search space (its tunables at their defaults), compiled on this machine for ``arch``;
    None when it compiles, or when that cannot be told here (a space that does not build, a
    toolchain this machine lacks)."""
    from r3tui.compile.base import first_error_line, get_toolchain
    from r3tui.engine.inner import build_space, compile_request

    try:
        config = build_space(launch, source, inner, limits).baseline_config()
    except (R3Error, ValueError):
        return None
    chain = get_toolchain(config.toolchain)
    if not chain.available()[0]:
        return None
    compiled = chain.compile(compile_request(source, config, arch))
    return None if compiled.ok else first_error_line(compiled.log)


def recorded_arch(bundle: Bundle) -> str | None:
    """``sm_XY`` of the GPU a bundle was recorded on (its provenance), None if not recorded."""
    capability = str(bundle.manifest.provenance.get("compute_capability") or "")
    major, _, minor = capability.partition(".")
    return f"sm_{major}{minor}" if major.isdigit() and minor.isdigit() else None
