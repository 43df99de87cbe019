"""LLVM as a toolchain: clang -> ``opt -passes=<pipeline>`` -> llc -> ptxas, one subprocess each.

NVRTC and nvcc run NVVM's fixed optimization pipeline; here the pipeline is an option
(``--passes=default<O2>``, see :data:`PIPELINES`), which is how the search tunes pass
ordering.  The stages, each run in a temporary directory on relative file names so that the log
names no temporary path (``LLVM_MAJOR`` is 19; ``<cuda>`` is the CUDA toolkit found by
:func:`find_cuda_root`)::

    clang-19 -x cuda --cuda-device-only --cuda-gpu-arch=sm_90 --cuda-path=<cuda>
             -isystem __r3_stubs -isystem <cuda>/include/cccl -Wno-unknown-cuda-version
             -O1 -Xclang -disable-llvm-optzns [math flags] [-D...] [-I...]
             -S -emit-llvm kernel.cu -o __r3.ll
    opt-19   -passes=<pipeline> __r3.ll -o __r3.opt.bc
    llc-19   -mcpu=sm_90 -mattr=+ptx80 -nvptx-prec-sqrtf32=1 [math flags] __r3.opt.bc -o __r3.ptx
    ptxas    -arch=sm_90 -v [ptxas options] __r3.ptx -o __r3.cubin

Why each choice:

- ``-O1 -Xclang -disable-llvm-optzns``: the front end emits IR as for -O1 (TBAA, lifetime
  markers, no ``optnone``) and runs no LLVM pass, so all IR optimization is the pipeline's.
- ``-isystem __r3_stubs``: clang 19's CUDA wrapper includes ``texture_fetch_functions.h`` (gone
  from CUDA 13) and ``curand_mtgp32_kernel.h`` (absent without curand).  Empty stand-ins are
  written into each compile's temporary directory, only for the headers the toolkit lacks, so
  no header file ships with the package.
- ``__CUDA_PREC_SQRT``: libdevice's ``sqrtf`` asks ``__nvvm_reflect("__CUDA_PREC_SQRT")``,
  which LLVM 19 answers with 0 (an approximate square root) whatever the flags; nvcc's default is
  the IEEE one.  With ``prec-sqrt`` true (the default unless ``--use_fast_math``) those calls are
  replaced by the constant 1 in the front end's IR before ``opt`` runs.
- PTX ISA 8.0: the oldest that sm_90a needs (LLVM 19 writes up to 8.5), well inside what
  CUDA 13's ptxas reads.
- libdevice (``<cuda>/nvvm/libdevice``) is linked by clang for the math functions; a toolkit
  without it gets ``-nogpulib`` and only math-free kernels link.

Options are the nvcc spellings that :func:`~r3tui.compile.options.canonicalize` accepts for
``llvm`` (see :func:`~r3tui.compile.options.accepted_options`); their canonical pairs are
translated here: the math switches go to clang and llc (``-nvptx-prec-divf32``,
``-nvptx-prec-sqrtf32``, ``-nvptx-fma-level``), ``--maxrregcount`` and the ``-Xptxas`` options to
ptxas.  ``-O<n>`` is the ptxas level, as for the other toolchains; the LLVM level is the
pipeline (``default<O1>``...).

A stage that fails (a source error in clang, a bad pipeline in opt, ...) is a failed result
whose log shows every stage's command and output and ends with the stage that failed.  The front
end's output depends only on the source and its flags, so within a process it is reused when
only the pipeline or the back-end options change (the search's common case).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from r3tui.compile.base import (
    CompiledKernel,
    CompileRequest,
    Toolchain,
    cache_key,
    header_digest,
    is_identifier,
)
from r3tui.compile.nvcc import lowered_name
from r3tui.compile.options import LLVM_PIPELINES, Canonical
from r3tui.errors import ToolchainError

LLVM_MAJOR = 19
PTX_ISA = "ptx80"
PIPELINES: tuple[str, ...] = LLVM_PIPELINES
DEFAULT_PIPELINE = "default<O3>"
# The oldest arch CUDA 13's ptxas builds.
MIN_SM = 75
# Bump when the command lines change what a cubin is (it goes into the cache key).
RECIPE = 1

_LLVM_HINT = f"apt-get install clang-{LLVM_MAJOR} llvm-{LLVM_MAJOR}"
_CUDA_HINT = "install the CUDA toolkit (ptxas and headers) or set CUDA_HOME"
_STUB_DIR = "__r3_stubs"
_STUB_HEADERS: dict[str, str] = {
    "texture_fetch_functions.h": (
        "// R³ stand-in: CUDA 13 removed texture references; clang's CUDA wrapper includes this.\n"
    ),
    "curand_mtgp32_kernel.h": (
        "// R³ stand-in: clang's CUDA wrapper includes this curand header; the toolkit has no"
        " curand.\n"
    ),
}
_FRONTEND_MEMO_SIZE = 16
_CLANG_VERSION = re.compile(r"clang version (\d+)\.(\d+)\.(\d+)")
_LLVM_VERSION = re.compile(r"LLVM version (\d+)\.(\d+)\.(\d+)")
_PTXAS_VERSION = re.compile(r"V(\d+\.\d+\.\d+)")
_SM = re.compile(r"\bsm_(\d+)\b")


def find_llvm_tool(tool: str) -> str | None:
    """``<tool>-19`` on ``PATH``, else ``/usr/lib/llvm-19/bin/<tool>``, else ``<tool>`` on
    ``PATH`` (its version is checked when it runs)."""
    suffixed = shutil.which(f"{tool}-{LLVM_MAJOR}")
    if suffixed:
        return suffixed
    bundled = f"/usr/lib/llvm-{LLVM_MAJOR}/bin/{tool}"
    if os.access(bundled, os.X_OK):
        return bundled
    return shutil.which(tool)


def find_cuda_root() -> str | None:
    """The CUDA toolkit clang compiles against: ``$CUDA_HOME``, ``$CUDA_PATH``,
    ``/usr/local/cuda``, then the newest ``/usr/local/cuda-*`` that has the runtime headers."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in roots:
        if root and Path(root, "include", "cuda_runtime.h").is_file():
            return os.path.realpath(root)
    return None


@dataclass(frozen=True)
class LlvmTools:
    """Where each stage's program is, and the toolkit clang reads headers and libdevice from."""

    clang: str
    opt: str
    llc: str
    ptxas: str
    cuda_root: str

    @property
    def libdevice(self) -> bool:
        return bool(glob.glob(os.path.join(self.cuda_root, "nvvm", "libdevice", "libdevice*.bc")))


@dataclass
class _Flags:
    """A request's canonical options as arguments of each stage."""

    clang: list[str] = field(default_factory=list)
    llc: list[str] = field(default_factory=list)
    ptxas: list[str] = field(default_factory=list)
    pipeline: str = DEFAULT_PIPELINE
    prec_sqrt: bool = True

    @classmethod
    def of(cls, canonical: Canonical) -> _Flags:
        options = dict(canonical)
        fast = "use_fast_math" in options
        flags = cls(pipeline=options.get("passes", DEFAULT_PIPELINE))
        if fast:
            flags.clang += ["-ffast-math", "-fgpu-approx-transcendentals"]
        # nvcc: --use_fast_math implies ftz=true, prec-div=false, prec-sqrt=false, fmad=true;
        # an explicit switch wins.
        ftz = options.get("ftz", "true" if fast else "false") == "true"
        flags.clang.append(
            "-fgpu-flush-denormals-to-zero" if ftz else "-fno-gpu-flush-denormals-to-zero"
        )
        if "prec-div" in options:
            # nvcc's -prec-div=false is div.full (approximate, full range), fast math div.approx.
            flags.llc.append(f"-nvptx-prec-divf32={2 if options['prec-div'] == 'true' else 1}")
        elif fast:
            flags.llc.append("-nvptx-prec-divf32=0")
        flags.prec_sqrt = options.get("prec-sqrt", "false" if fast else "true") == "true"
        flags.llc.append(f"-nvptx-prec-sqrtf32={int(flags.prec_sqrt)}")
        if options.get("fmad") == "false":
            flags.clang.append("-ffp-contract=off")
            flags.llc.append("-nvptx-fma-level=0")
            flags.ptxas.append("--fmad=false")
        elif "fmad" in options:
            flags.clang.append("-ffp-contract=fast")
        if "std" in options:
            flags.clang.append(f"-std={options['std']}")
        if "maxrregcount" in options:
            flags.ptxas.append(f"--maxrregcount={options['maxrregcount']}")
        if "opt-level" in options:
            flags.ptxas.append(f"-O{options['opt-level']}")
        if "def-load-cache" in options:
            flags.ptxas.append(f"-dlcm={options['def-load-cache']}")
        if "allow-expensive-optimizations" in options:
            value = options["allow-expensive-optimizations"]
            flags.ptxas.append(f"--allow-expensive-optimizations={value}")
        if "warn-on-spills" in options:
            flags.ptxas.append("--warn-on-spills")
        return flags


class _StageFailed(Exception):
    """A stage exited non-zero or timed out; ``log`` is its section of the compile log."""

    def __init__(self, log: str) -> None:
        super().__init__(log)
        self.log = log


class LlvmToolchain(Toolchain):
    """clang, opt and llc of LLVM 19 plus the CUDA toolkit's ptxas, run once per stage."""

    name = "llvm"

    def __init__(
        self,
        *,
        clang: str | None = None,
        opt: str | None = None,
        llc: str | None = None,
        ptxas: str | None = None,
        cuda_root: str | None = None,
        timeout_s: float = 120.0,
        reuse_frontend: bool = True,
    ) -> None:
        self._given = {"clang": clang, "opt": opt, "llc": llc, "ptxas": ptxas}
        self._cuda_root = cuda_root
        self.timeout_s = timeout_s
        self.reuse_frontend = reuse_frontend
        self._tools: LlvmTools | None = None
        self._memo: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self._memo_lock = threading.Lock()

    # -- the Toolchain interface -----------------------------------------------------------

    def tools(self) -> LlvmTools:
        """The programs this toolchain runs; :class:`ToolchainError` when one is missing."""
        if self._tools is not None:
            return self._tools
        found: dict[str, str] = {}
        for tool in ("clang", "opt", "llc"):
            path = self._given[tool] or find_llvm_tool(tool)
            if path is None:
                raise ToolchainError(f"{tool}-{LLVM_MAJOR} is not installed", hint=_LLVM_HINT)
            if not os.access(path, os.X_OK):
                raise ToolchainError(f"{tool} {path} is not an executable", hint=_LLVM_HINT)
            found[tool] = path
        root = self._cuda_root or find_cuda_root()
        if root is None:
            raise ToolchainError(
                "no CUDA toolkit headers (include/cuda_runtime.h) under $CUDA_HOME, $CUDA_PATH "
                "or /usr/local/cuda*",
                hint=_CUDA_HINT,
            )
        ptxas = self._given["ptxas"]
        if ptxas is None:
            in_root = os.path.join(root, "bin", "ptxas")
            ptxas = in_root if os.access(in_root, os.X_OK) else shutil.which("ptxas")
        if ptxas is None:
            raise ToolchainError(f"ptxas is not in {root}/bin nor on PATH", hint=_CUDA_HINT)
        self._tools = LlvmTools(found["clang"], found["opt"], found["llc"], ptxas, root)
        return self._tools

    def version(self) -> str:
        tools = self.tools()
        return (
            f"clang {_llvm_version(tools.clang, _CLANG_VERSION)} / "
            f"opt {_llvm_version(tools.opt, _LLVM_VERSION)} / "
            f"llc {_llvm_version(tools.llc, _LLVM_VERSION)} / "
            f"ptxas {_ptxas_version(tools.ptxas)}"
        )

    def fingerprint(self) -> str:
        tools = self.tools()
        stubs = sorted(_missing_headers(tools.cuda_root))
        return (
            f"{self.version()}; cuda {tools.cuda_root}; libdevice {tools.libdevice}; "
            f"{PTX_ISA}; stubs {','.join(stubs)}; recipe {RECIPE}"
        )

    def supported_archs(self) -> tuple[str, ...]:
        return _llc_archs(self.tools().llc)

    def available(self) -> tuple[bool, str]:
        try:
            version = self.version()
            archs = self.supported_archs()
            tools = self.tools()
        except ToolchainError as exc:
            return False, exc.one_line()
        if not archs:
            return False, f"{version}: llc lists no NVPTX arch sm_{MIN_SM}+ ({_LLVM_HINT})"
        where = f"clang at {tools.clang}, ptxas at {tools.ptxas}, CUDA {tools.cuda_root}" + (
            "" if tools.libdevice else ", no libdevice: math functions will not link"
        )
        return True, f"{version} ({where}), cubins for {archs[0]}..{archs[-1]}"

    def compile(self, req: CompileRequest) -> CompiledKernel:
        canonical = self.validate(req)
        tools = self.tools()
        key = cache_key(self, req)
        flags = _Flags.of(canonical)
        source = req.source
        if not is_identifier(req.kernel_name):
            # As for nvcc: a host-side reference instantiates the template on the device side.
            source += (
                f"\n// added by R³: instantiate the requested kernel\n"
                f"void* const __r3_kernel_reference = (void*)&{req.kernel_name};\n"
            )
        name = Path(req.source_name).name or "kernel.cu"
        logs: list[str] = []
        started = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="r3-llvm-") as tmp:
                Path(tmp, name).write_text(source)
                ir, clang_log = self._frontend(tools, req, name, source, flags, tmp)
                logs.append(clang_log)
                if flags.prec_sqrt:
                    ir = set_nvvm_reflect(ir, "__CUDA_PREC_SQRT", 1)
                Path(tmp, "__r3.ll").write_text(ir)
                opt = [tools.opt, f"-passes={flags.pipeline}", "__r3.ll", "-o", "__r3.opt.bc"]
                logs.append(self._stage("opt", opt, tmp))
                llc = [
                    tools.llc,
                    f"-mcpu={req.arch}",
                    f"-mattr=+{PTX_ISA}",
                    *flags.llc,
                    "__r3.opt.bc",
                    "-o",
                    "__r3.ptx",
                ]
                logs.append(self._stage("llc", llc, tmp))
                ptxas = [
                    tools.ptxas,
                    f"-arch={req.arch}",
                    "-v",
                    *flags.ptxas,
                    "__r3.ptx",
                    "-o",
                    "__r3.cubin",
                ]
                logs.append(self._stage("ptxas", ptxas, tmp))
                cubin = Path(tmp, "__r3.cubin").read_bytes()
        except _StageFailed as failed:
            logs.append(failed.log)
            return CompiledKernel.failure(
                self, _join(logs), cache_key=key, seconds=time.perf_counter() - started
            )
        seconds = time.perf_counter() - started
        log = _join(logs)
        lowered, problem = lowered_name(cubin, req.kernel_name)
        if lowered is None:
            return CompiledKernel.failure(self, f"{log}\n{problem}", cache_key=key, seconds=seconds)
        return CompiledKernel.from_cubin(
            self, cubin, lowered, log, cache_key=key, seconds=seconds
        )

    # -- stages ------------------------------------------------------------------------------

    def _frontend(
        self,
        tools: LlvmTools,
        req: CompileRequest,
        name: str,
        source: str,
        flags: _Flags,
        tmp: str,
    ) -> tuple[str, str]:
        """clang's IR for ``source`` and its stage log, from the memo when the same source was
        compiled with the same front-end flags before."""
        stubs = _missing_headers(tools.cuda_root)
        command = [
            tools.clang,
            "-x",
            "cuda",
            "--cuda-device-only",
            f"--cuda-gpu-arch={req.arch}",
            f"--cuda-path={tools.cuda_root}",
            *([] if tools.libdevice else ["-nogpulib"]),
            "-isystem",
            _STUB_DIR,
            *_cccl_include(tools.cuda_root),
            "-Wno-unknown-cuda-version",
            "-O1",
            "-Xclang",
            "-disable-llvm-optzns",
            *flags.clang,
            *(f"-D{n}={v}" for n, v in req.defines),
            # Absolute: clang runs in the temporary directory.
            *(f"-I{os.path.abspath(d)}" for d in req.include_dirs),
            "-S",
            "-emit-llvm",
            name,
            "-o",
            "__r3.ll",
        ]
        memo_key = hashlib.sha256(
            json.dumps(
                [
                    command,
                    source,
                    header_digest(source, req.include_dirs) if req.include_dirs else "",
                    sorted(stubs),
                ]
            ).encode()
        ).hexdigest()
        if self.reuse_frontend:
            with self._memo_lock:
                hit = self._memo.get(memo_key)
                if hit is not None:
                    self._memo.move_to_end(memo_key)
                    return hit
        Path(tmp, _STUB_DIR).mkdir()
        for header in stubs:
            Path(tmp, _STUB_DIR, header).write_text(_STUB_HEADERS[header])
        log = self._stage("clang", command, tmp)
        result = (Path(tmp, "__r3.ll").read_text(), log)
        if self.reuse_frontend:
            with self._memo_lock:
                self._memo[memo_key] = result
                while len(self._memo) > _FRONTEND_MEMO_SIZE:
                    self._memo.popitem(last=False)
        return result

    def _stage(self, stage: str, command: Sequence[str], cwd: str) -> str:
        """Run one stage; its log (command line, then output), or :class:`_StageFailed`."""
        shown = shlex.join([os.path.basename(command[0]), *command[1:]])
        try:
            run = subprocess.run(
                list(command),
                cwd=cwd,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            output = (_text(exc.stdout) + _text(exc.stderr)).rstrip()
            status = f"{stage} timed out after {self.timeout_s:g} s"
            raise _StageFailed(_section(shown, output, status)) from None
        except OSError as exc:
            hint = _CUDA_HINT if stage == "ptxas" else _LLVM_HINT
            raise ToolchainError(f"{stage} cannot run: {exc}", hint=hint) from exc
        output = (run.stdout + run.stderr).rstrip()
        if run.returncode != 0:
            raise _StageFailed(_section(shown, output, f"{stage} failed: {_status(run)}"))
        # No timing in a successful stage's log: the log is cached with the cubin and should
        # not differ between two compiles of the same request.
        return _section(shown, output)


def set_nvvm_reflect(ir: str, name: str, value: int) -> str:
    """``ir`` with every ``__nvvm_reflect("<name>")`` call replaced by the constant ``value``
    (what NVVM's reflect pass does for the names LLVM 19 does not know)."""
    strings = re.findall(rf'^(@[-\w.$]+) = [^\n]*c"{re.escape(name)}\\00"', ir, flags=re.MULTILINE)
    for symbol in strings:
        call = re.compile(
            r"(%[-\w.$]+) = (?:tail |notail |musttail )?call i32 @__nvvm_reflect\("
            rf"ptr (?:noundef )?{re.escape(symbol)}\)[^\n]*"
        )
        ir = call.sub(rf"\1 = add i32 0, {int(value)}", ir)
    return ir


def _missing_headers(cuda_root: str) -> list[str]:
    return [h for h in _STUB_HEADERS if not Path(cuda_root, "include", h).is_file()]


def _cccl_include(cuda_root: str) -> list[str]:
    # CUDA 13 moved CCCL (<cuda/std/...>, CUB, Thrust) under include/cccl; nvcc adds it itself.
    cccl = os.path.join(cuda_root, "include", "cccl")
    return ["-isystem", cccl] if os.path.isdir(cccl) else []


def _section(command: str, output: str, status: str = "") -> str:
    lines = [f"$ {command}", *([output] if output else []), *([f"r3: {status}"] if status else [])]
    return "\n".join(lines)


def _join(logs: list[str]) -> str:
    return "\n".join(logs).rstrip()


def _status(run: subprocess.CompletedProcess[str]) -> str:
    if run.returncode < 0:
        try:
            return f"killed by {signal.Signals(-run.returncode).name}"
        except ValueError:
            return f"killed by signal {-run.returncode}"
    return f"exit status {run.returncode}"


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _run_version(executable: str, hint: str) -> str:
    try:
        run = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"{executable} --version failed: {exc}", hint=hint) from exc
    return run.stdout + run.stderr


@functools.cache
def _llvm_version(executable: str, pattern: re.Pattern[str]) -> str:
    text = _run_version(executable, _LLVM_HINT)
    match = pattern.search(text)
    if match is None:
        raise ToolchainError(f"{executable} --version printed no LLVM version", hint=_LLVM_HINT)
    if int(match.group(1)) != LLVM_MAJOR:
        raise ToolchainError(
            f"{executable} is LLVM {match.group(1)}; the llvm toolchain needs LLVM {LLVM_MAJOR}",
            hint=_LLVM_HINT,
        )
    return ".".join(match.groups())


@functools.cache
def _ptxas_version(executable: str) -> str:
    match = _PTXAS_VERSION.search(_run_version(executable, _CUDA_HINT))
    if match is None:
        raise ToolchainError(f"{executable} --version printed no CUDA release", hint=_CUDA_HINT)
    return match.group(1)


@functools.cache
def _llc_archs(executable: str) -> tuple[str, ...]:
    """The real archs (no ``a`` suffix) llc's NVPTX back end knows, from sm_75 (CUDA 13's
    oldest) up."""
    try:
        run = subprocess.run(
            [executable, "-march=nvptx64", "-mcpu=help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"{executable} -mcpu=help failed: {exc}", hint=_LLVM_HINT) from exc
    numbers = sorted({int(n) for n in _SM.findall(run.stdout + run.stderr)})
    return tuple(f"sm_{n}" for n in numbers if n >= MIN_SM)
