"""``r3 record -- ./app ARGS``: run an unmodified CUDA application under the interposer.

Builds (or finds in the cache) the interposer library, runs the application with
``LD_PRELOAD`` and ``R3_RECORD_DIR`` pointing at a raw dump inside the output directory,
then converts the dump into bundles and ``recording.json`` (:mod:`r3tui.record.app_dump`).

Supported builds: the default static CUDA runtime and ``-cudart=shared`` (both reach the
driver through ``cuGetProcAddress``, which the interposer hooks), and programs that call the
driver API through libcuda.so.  Not supported, and reported as such: statically linked
executables (LD_PRELOAD cannot reach them) and programs whose CUDA calls never reach the
interposer (e.g. a runtime that resolves the driver in a way other than dlsym/cuGetProcAddress).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.cuda.arena import GUARD_BYTES
from r3tui.errors import ApplicationTimedOut, GpuUnavailable, R3Error, RecordingError
from r3tui.record import app_dump, interposer
from r3tui.record.strata import DEFAULT_WINDOWS, STRATA_FILE, read_strata_source

if TYPE_CHECKING:
    from r3tui.record.sources import KernelSource

RAW_DIR = "raw"
# Snapshot bounds (docs/app-recording.md, "Bounded snapshots").  A snapshot costs a
# synchronization and two copies of the memory it keeps (about 66 ms for lud's 64 MiB matrix
# on the H200), so a program whose grid changes on every launch must not snapshot them all;
# tuning a kernel needs one configuration, and a few give it the shapes it runs with.
MAX_CONFIGS = 4
MAX_SNAPSHOT_BYTES = 8 << 30
# Each snapshot byte is on disk twice until conversion ends: in the raw dump and in a bundle
# (blobs are copies, compressed where that helps), so a quarter of the free space keeps the
# recording within half of it, leaving the rest to the application's own output.
FREE_SPACE_SHARE = 4


@dataclass(frozen=True)
class AppRecordRequest:
    command: tuple[str, ...]
    out: Path
    sources: tuple[Path, ...] = ()
    compile_db: Path | None = None
    include_dirs: tuple[Path, ...] = ()  # searched after a unit's own -I directories
    reachable: bool = False
    checks: bool = True  # snapshot each configuration's second launch as a check launch
    kernels: tuple[str, ...] = ()
    overwrite: bool = False
    keep_raw: bool = False
    guard_bytes: int = GUARD_BYTES  # free, mapped, zeroed bytes around each allocation
    max_configs: int = MAX_CONFIGS  # configurations snapshotted per kernel
    # an earlier recording of the same run: its configurations whose later launches do other
    # work are cut into `strata` runs, each recorded as a stratum (r3tui.record.strata)
    strata_from: Path | None = None
    strata: int = DEFAULT_WINDOWS
    max_snapshot_bytes: int | None = None  # None: snapshot_budget()'s default
    timeout_s: float | None = None  # kill the application after this long (None: never)


@dataclass
class AppRecording:
    out: Path
    data: dict[str, Any]
    messages: list[str] = field(default_factory=list)
    saved: bool = True  # recording.json was written (False: the disk was full)


@dataclass(frozen=True)
class ExecutableInfo:
    runtime: str  # "shared" | "driver" | "static" | "unknown" (decided after the run)
    static_executable: bool
    needed: tuple[str, ...]


def inspect_executable(path: Path) -> ExecutableInfo:
    """What the dynamic section says: which CUDA libraries it needs, whether it is static."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return ExecutableInfo("unknown", False, ())
    try:
        run = subprocess.run([readelf, "-d", "-l", "--wide", str(path)], capture_output=True,
                             text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ExecutableInfo("unknown", False, ())
    if run.returncode != 0:  # not ELF: a script; its interpreter's children are recorded
        return ExecutableInfo("unknown", False, ())
    needed = tuple(line.split("[", 1)[1].rstrip("]").strip()
                   for line in run.stdout.splitlines() if "(NEEDED)" in line and "[" in line)
    static = "INTERP" not in run.stdout and "(NEEDED)" not in run.stdout
    runtime = "unknown"
    if any(n.startswith("libcudart.so") for n in needed):
        runtime = "shared"
    elif any(n.startswith("libcuda.so") for n in needed):
        runtime = "driver"
    return ExecutableInfo(runtime, static, needed)


def resolve_executable(command: Sequence[str]) -> Path:
    if not command:
        raise R3Error("no application to record: write `r3 record -- ./app ARGS...`")
    first = command[0]
    local = first if Path(first).is_file() else None
    found = local if os.sep in first else shutil.which(first)
    if found is None:
        raise R3Error(f"no executable {first!r} (not a file, not on PATH)")
    path = Path(found)
    if not os.access(path, os.X_OK):
        raise R3Error(f"{first} is not executable")
    return path


def snapshot_budget(out: Path, requested: int | None) -> tuple[int, str]:
    """The bytes of snapshots a recording may write, and where that figure comes from:
    ``requested`` (--max-snapshot-bytes), else the smaller of MAX_SNAPSHOT_BYTES and a
    FREE_SPACE_SHARE-th of the space free under ``out`` (which exists)."""
    if requested is not None:
        return requested, "--max-snapshot-bytes"
    from r3tui.record.app_dump import size_text

    free = shutil.disk_usage(out).free
    share = free // FREE_SPACE_SHARE
    if share < MAX_SNAPSHOT_BYTES:
        return share, f"a quarter of the {size_text(free)} free under {out}"
    return MAX_SNAPSHOT_BYTES, f"the default {size_text(MAX_SNAPSHOT_BYTES)}"


def _prepare_out(out: Path, overwrite: bool) -> None:
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise RecordingError(f"{out} already exists and is not empty; choose another --out "
                                 "or pass --force")
        for child in (out / app_dump.BUNDLE_DIR, out / RAW_DIR):
            shutil.rmtree(child, ignore_errors=True)
        (out / app_dump.RECORDING_NAME).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def _source_lookup(req: AppRecordRequest) -> Callable[[str], app_dump.SourceChoice | None]:
    cache: dict[str, app_dump.SourceChoice | None] = {}
    units: dict[tuple[Path, tuple[Path, ...]], app_dump.SourceChoice] = {}  # headers per unit

    def lookup(entry_point: str) -> app_dump.SourceChoice | None:
        if entry_point in cache:
            return cache[entry_point]
        choice = None
        if req.sources or req.compile_db is not None:
            from r3tui.record.sources import associate

            found = associate(entry_point, list(req.sources), req.compile_db, req.include_dirs)
            if found is not None:
                unit = units.get((found.path, found.include_dirs))
                if unit is None:
                    unit = units[(found.path, found.include_dirs)] = _source_choice(found)
                choice = replace(unit, kernel=found.kernel)
        cache[entry_point] = choice
        return choice

    return lookup


def _source_choice(found: KernelSource) -> app_dump.SourceChoice:
    """The unit with the application headers it reaches; a missing header is the choice's
    ``problem`` (a warning in the recording), not a failed recording."""
    from r3tui.record.headers import collect

    choice = app_dump.SourceChoice(
        path=str(found.path), file_name=found.path.name, text=found.text, kernel=found.kernel,
        # include directories go into the bundle as its header tree's, not as options: the
        # compile layer takes them only through CompileRequest.include_dirs
        options=tuple(found.options), defines=tuple(found.defines))
    try:
        tree = collect(found.path, found.text, found.include_dirs,
                       forced=found.forced_includes)
    except RecordingError as exc:
        return replace(choice, problem=exc.one_line())
    return replace(choice, headers=tree.files, include_dirs=tree.include_dirs,
                   header_origins=tuple(str(p) for p in tree.origins),
                   unresolved=tree.unresolved, forced_includes=tree.forced)


def _demangler() -> Callable[[str], str]:
    from r3tui.demangle import demangle

    def pretty(name: str) -> str:
        return demangle(name) or name

    return pretty


DRIVER_LIBRARY = "libcuda.so.1"


def missing_driver() -> str | None:
    """Why the CUDA driver library cannot be loaded here, or None when it can."""
    import ctypes

    try:
        ctypes.CDLL(DRIVER_LIBRARY)
    except OSError as exc:
        return " ".join(str(exc).split()) or f"{DRIVER_LIBRARY} not found"
    return None


def _diagnose(procs: list[app_dump.RawProcess], exe: ExecutableInfo, exit_code: int) -> None:
    """One clear line when the run produced nothing to convert."""
    if exe.static_executable:
        raise RecordingError("the application is a statically linked executable: LD_PRELOAD "
                             "cannot reach it (link it dynamically; see docs/app-recording.md)")
    if not procs:
        # checked after the run, not before: an application may bring its own libcuda
        # (LD_LIBRARY_PATH, a container's driver mount) that this process cannot see
        why = missing_driver()
        if why is not None:
            raise GpuUnavailable(
                f"no CUDA driver on this machine: {DRIVER_LIBRARY} cannot be loaded ({why}), "
                f"so the application reached no GPU and nothing was recorded (exit code "
                f"{exit_code})", hint="record on a node with the NVIDIA driver installed")
        raise RecordingError(
            "the interposer saw no CUDA activity (no allocation or launch reached the driver "
            f"through cuGetProcAddress or libcuda; exit code {exit_code}): supported builds are "
            "the static or shared CUDA runtime and the driver API (see docs/app-recording.md)")
    if not any(p.configs for p in procs):
        graph_launches = sum(g.launches for p in procs for g in p.graphs)
        if graph_launches:
            raise RecordingError(
                f"the application launched kernels only through CUDA graphs ({graph_launches} "
                f"graph launches; exit code {exit_code}), and graph launches are not recorded")
        raise RecordingError(
            f"the application made CUDA calls but no kernel launch was seen (exit code "
            f"{exit_code}); launches through a path the interposer does not wrap are not "
            "recorded")


def record_app(req: AppRecordRequest,
               progress: Callable[[str], None] = lambda _msg: None) -> AppRecording:
    exe_path = resolve_executable(req.command)
    exe = inspect_executable(exe_path)
    out = req.out.absolute()
    # read before the output is cleared: it may be the recording being replaced
    strata = [] if req.strata_from is None else read_strata_source(req.strata_from, req.strata)
    _prepare_out(out, req.overwrite)
    progress("building the interposer")
    lib = interposer.build()
    raw = out / RAW_DIR
    raw.mkdir()
    max_bytes, max_bytes_from = snapshot_budget(out, req.max_snapshot_bytes)
    env = dict(os.environ)
    previous = env.get("LD_PRELOAD")
    env["LD_PRELOAD"] = f"{lib.path} {previous}" if previous else str(lib.path)
    env["R3_RECORD_DIR"] = str(raw)
    env["R3_RECORD_REACHABLE"] = "1" if req.reachable else "0"
    env["R3_RECORD_CHECKS"] = "1" if req.checks else "0"
    env["R3_GUARD_BYTES"] = str(req.guard_bytes)
    env["R3_RECORD_MAX_CONFIGS"] = str(req.max_configs)
    if req.strata_from is not None:
        progress(f"strata: {len(strata)} configuration(s) of {req.strata_from} do other work "
                 f"in later launches; {req.strata} runs each" if strata else
                 f"strata: no configuration of {req.strata_from} does other work in later "
                 "launches; recording without strata")
    if strata:
        (out / STRATA_FILE).write_text("\n".join(strata) + "\n")
        env["R3_RECORD_STRATA_FILE"] = str(out / STRATA_FILE)
    env["R3_RECORD_MAX_BYTES"] = str(max_bytes)
    if req.kernels:
        env["R3_RECORD_KERNELS"] = ",".join(req.kernels)
    progress(f"running {' '.join(req.command)}")
    started = time.perf_counter()
    recorded_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    try:
        code = subprocess.run(list(req.command), env=env, check=False,
                              timeout=req.timeout_s).returncode
    except OSError as exc:
        raise R3Error(f"cannot run {req.command[0]}: {exc}") from exc
    except subprocess.TimeoutExpired as exc:  # subprocess.run has killed it
        if not req.keep_raw:
            shutil.rmtree(raw, ignore_errors=True)
        raise ApplicationTimedOut(
            f"{' '.join(req.command)} did not finish within {req.timeout_s:g} s under recording "
            "and was killed; nothing was recorded (--keep-raw keeps the interposer's dump, "
            f"{raw}, for a look at how far it got)") from exc
    wall = time.perf_counter() - started
    procs = app_dump.read_dump(raw)
    try:
        _diagnose(procs, exe, code)
    except R3Error:
        if not req.keep_raw:  # nothing worth keeping: leave no directory that blocks a rerun
            shutil.rmtree(raw, ignore_errors=True)
            if not any(out.iterdir()):
                out.rmdir()
        raise
    runtime = exe.runtime
    if runtime == "unknown" and any((p.end or {}).get("getproc") for p in procs):
        runtime = "static"
    progress("writing bundles")
    data = app_dump.build_recording(
        procs, out, command=req.command, cwd=os.getcwd(), runtime=runtime, wall_s=wall,
        exit_code=code, reachable=req.reachable, recorded_at=recorded_at,
        demangle=_demangler(), source_of=_source_lookup(req), progress=progress)
    if code != 0:
        data["warnings"].append(f"the application exited with code {code}")
    data["snapshots"]["max_bytes_from"] = max_bytes_from
    if not req.keep_raw:  # first: on a full disk this frees the room recording.json needs
        shutil.rmtree(raw, ignore_errors=True)
    return AppRecording(out, data, saved=_save(out, data))


def _save(out: Path, data: dict[str, Any]) -> bool:
    """Write recording.json; False when it cannot be (then ``write_error`` says so, unless
    an earlier write had already failed)."""
    import json

    tmp = out / f".{app_dump.RECORDING_NAME}.tmp"
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, out / app_dump.RECORDING_NAME)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if data.get("write_error") is None:
            bundles = [c["bundle"] for k in data["kernels"] for c in k["configs"] if c["bundle"]]
            size = sum(f.stat().st_size for f in (out / app_dump.BUNDLE_DIR).rglob("*")
                       if f.is_file()) if bundles else 0
            data["write_error"] = {
                "stage": "recording.json", "path": str(out / app_dump.RECORDING_NAME),
                "error": exc.strerror or str(exc), "errno": exc.errno or 0,
                "written_bytes": size, "bundles_written": len(bundles)}
        return False
    return True
