"""The compiler options R³ accepts, in one table, and their one canonical spelling.

NVRTC and nvcc spell the same switch several ways (``-maxrregcount=64``, ``--maxrregcount 64``,
``-Xptxas -O2``, ``--ptxas-options=-O2``, ``-Xptxas=-O2,-dlcm=cg``).  Every request's options are
parsed into canonical ``(name, value)`` pairs and rendered back in a spelling both toolchains
accept, so that

- the cache key does not depend on spelling or order,
- the cubin is byte-identical for equivalent spellings (ptxas records its own command line in
  the cubin's ``.note.nv.tkinfo`` note),
- an option that no toolchain here accepts, or that R³ refuses (``-G``, ``-rdc``, ``-arch``),
  fails with :class:`~r3tui.errors.ConfigError` before anything is compiled.

:func:`accepted_options` is the structured view the Bayesian search layer builds its space from.

The ``llvm`` toolchain (clang -> opt -> llc -> ptxas) takes the same spellings for the options it
honours (the ptxas ones, ``--maxrregcount`` and the math switches) and translates the canonical
pairs itself; its own option is ``--passes=<pipeline>``, the LLVM pass pipeline that ``opt``
runs, a choice among :data:`LLVM_PIPELINES` for the search that also takes any other pipeline
string (``opt`` judges it: a bad one is a failed compile, not a :class:`ConfigError`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from r3tui.errors import ConfigError

TOOLCHAIN_NAMES: tuple[str, ...] = ("nvrtc", "nvcc", "llvm")

OptionKind = Literal["flag", "choice", "int"]
Canonical = tuple[tuple[str, str], ...]

_BOTH = frozenset({"nvrtc", "nvcc"})  # NVIDIA's front ends take every nvcc-style option
_WITH_LLVM = _BOTH | {"llvm"}  # options r3tui.compile.llvm translates for clang/llc/ptxas

# The pass pipelines the search chooses among for the llvm toolchain (``opt -passes=``).  Each
# was compiled for sm_90 on every example kernel; the hand-ordered ones inline first
# (``cgscc(inline)``: a call left in a kernel costs far more than any ordering wins) and end with
# ``globaldce`` so that ptxas does not assemble dead device functions.
LLVM_PIPELINES: tuple[str, ...] = (
    "default<O3>",
    "default<O2>",
    "default<O1>",
    # scalar clean-up only: no loop passes at all
    "cgscc(inline),function(sroa,instcombine,simplifycfg),globaldce",
    # scalar + GVN + loop-invariant code motion, no unrolling
    "cgscc(inline),function(sroa,early-cse,instcombine,simplifycfg,gvn,loop-mssa(licm),"
    "instcombine,simplifycfg),globaldce",
    # the same with partial/runtime unrolling after LICM
    "cgscc(inline),function(sroa,instcombine,simplifycfg,gvn,loop-mssa(licm),loop-unroll,"
    "instcombine,simplifycfg),globaldce",
    # rotate, LICM, induction-variable simplification, then full unrolling of constant trips
    "cgscc(inline),function(sroa,early-cse,loop(loop-rotate),loop-mssa(licm),"
    "loop(indvars,loop-unroll-full),instcombine,simplifycfg,gvn),globaldce",
    # unrolling followed by SLP and load/store vectorization (wide ld/st.v2/v4)
    "cgscc(inline),function(sroa,instcombine,simplifycfg,loop-mssa(licm),loop-unroll,"
    "slp-vectorizer,load-store-vectorizer,instcombine,gvn),globaldce",
)


@dataclass(frozen=True)
class OptionSpec:
    """One compiler option R³ accepts.

    ``name`` is toolchain-neutral; ``ptxas`` options travel inside ``--ptxas-options=``.
    For ``kind="flag"`` the value is on/off; ``"choice"`` takes one of ``values``;
    ``"int"`` takes an integer in ``[low, high]``.  ``tunable`` says whether the search should
    vary it (``-lineinfo`` and ``--std`` change no performance, so they are not).
    An ``open_values`` choice also takes values outside ``values`` (the search draws from
    ``values``; the compiler judges the others).
    """

    name: str
    kind: OptionKind
    spellings: tuple[str, ...]
    help: str
    values: tuple[str, ...] = ()
    low: int | None = None
    high: int | None = None
    ptxas: bool = False
    tunable: bool = True
    toolchains: frozenset[str] = _BOTH
    open_values: bool = False

    def tokens(self, value: bool | int | str = True) -> tuple[str, ...]:
        """The command-line tokens that set this option to ``value`` (``()`` for an off flag)."""
        if self.kind == "flag":
            if value in (False, "", "false", 0):
                return ()
            return (_render(self, ""),)
        return (_render(self, self.check(str(value))),)

    def check(self, value: str) -> str:
        """``value`` normalised, or :class:`ConfigError` when this option does not take it."""
        if self.kind == "flag":
            if value:
                raise ConfigError(f"compiler option {self.spellings[0]} takes no value")
            return ""
        if self.kind == "int":
            try:
                number = int(value)
            except ValueError:
                raise ConfigError(
                    f"compiler option {self.spellings[0]} needs an integer, got {value!r}"
                ) from None
            assert self.low is not None and self.high is not None
            if not self.low <= number <= self.high:
                raise ConfigError(
                    f"compiler option {self.spellings[0]}={number} is outside "
                    f"{self.low}..{self.high}"
                )
            return str(number)
        if self.open_values and value not in self.values:
            if not value.strip() or any(c in value for c in "\n\r\0"):
                raise ConfigError(f"compiler option {self.spellings[0]} needs a value")
            return value
        if value not in self.values:
            raise ConfigError(
                f"compiler option {self.spellings[0]} takes one of {', '.join(self.values)}, "
                f"got {value!r}"
            )
        return value


_BOOL = ("true", "false")

# Spellings were tried against NVRTC 13.0 and nvcc 13.0 (both accept every canonical form
# rendered by _render).  The first spelling is the canonical one.
SPECS: tuple[OptionSpec, ...] = (
    OptionSpec(
        "use_fast_math",
        "flag",
        ("--use_fast_math", "-use_fast_math"),
        "fast, less precise math: implies ftz=true, prec-div/prec-sqrt=false, fmad=true",
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "ftz",
        "choice",
        ("--ftz", "-ftz"),
        "flush single-precision denormals to zero",
        values=_BOOL,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "prec-div",
        "choice",
        ("--prec-div", "-prec-div"),
        "IEEE round-to-nearest single-precision division",
        values=_BOOL,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "prec-sqrt",
        "choice",
        ("--prec-sqrt", "-prec-sqrt"),
        "IEEE round-to-nearest single-precision square root",
        values=_BOOL,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "fmad",
        "choice",
        ("--fmad", "-fmad"),
        "contract multiply-add into FMA",
        values=_BOOL,
        toolchains=_WITH_LLVM,
    ),
    # ptxas silently raises limits below its ABI minimum (24 on sm_90), so 16 is a floor
    # that still means "as few as possible".
    OptionSpec(
        "maxrregcount",
        "int",
        ("--maxrregcount", "-maxrregcount"),
        "maximum registers per thread (ignored for kernels with __launch_bounds__)",
        low=16,
        high=255,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "extra-device-vectorization",
        "flag",
        ("--extra-device-vectorization", "-extra-device-vectorization"),
        "more aggressive vectorisation in the NVVM optimizer",
    ),
    OptionSpec(
        "restrict",
        "flag",
        ("--restrict", "-restrict"),
        "assume kernel pointer parameters do not alias",
    ),
    OptionSpec(
        "generate-line-info",
        "flag",
        ("--generate-line-info", "-lineinfo"),
        "line-number information for profilers (no effect on speed)",
        tunable=False,
    ),
    OptionSpec(
        "std",
        "choice",
        ("--std", "-std"),
        "C++ dialect",
        values=("c++11", "c++14", "c++17", "c++20"),
        tunable=False,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "opt-level",
        "int",
        ("-O", "--opt-level"),
        "ptxas optimization level (a cubin has no host code, so top-level -O<n> means this too)",
        low=0,
        high=3,
        ptxas=True,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "def-load-cache",
        "choice",
        ("-dlcm", "--def-load-cache"),
        "default cache operator for global loads: ca = L1+L2, cg = L2 only",
        values=("ca", "cg"),
        ptxas=True,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "allow-expensive-optimizations",
        "choice",
        ("--allow-expensive-optimizations", "-allow-expensive-optimizations"),
        "let ptxas spend more memory and time optimizing",
        values=_BOOL,
        ptxas=True,
        toolchains=_WITH_LLVM,
    ),
    OptionSpec(
        "warn-on-spills",
        "flag",
        ("--warn-on-spills", "-warn-spills"),
        "ptxas warns when registers spill",
        ptxas=True,
        tunable=False,
        toolchains=_WITH_LLVM,
    ),
    # Appended last: canonical order (and so existing cache keys) of the options above stays.
    OptionSpec(
        "passes",
        "choice",
        ("--passes", "-passes"),
        "LLVM pass pipeline run by opt (llvm toolchain; default default<O3>)",
        values=LLVM_PIPELINES,
        toolchains=frozenset({"llvm"}),
        open_values=True,
    ),
)

_BY_NAME = {spec.name: spec for spec in SPECS}
_ORDER = {spec.name: index for index, spec in enumerate(SPECS)}
_FRONTEND = {s: spec for spec in SPECS if not spec.ptxas for s in spec.spellings}
_PTXAS = {s: spec for spec in SPECS if spec.ptxas for s in spec.spellings}

# Switches R³ sets itself or refuses, each with the reason a user sees.
_REFUSED: dict[str, str] = {
    "-G": "device debug code is not worth tuning",
    "--device-debug": "device debug code is not worth tuning",
    "-g": "host debug information has no meaning for a cubin",
    "-rdc": "relocatable device code needs a link step R³ does not run",
    "--relocatable-device-code": "relocatable device code needs a link step R³ does not run",
    "-dc": "relocatable device code needs a link step R³ does not run",
    "--device-c": "relocatable device code needs a link step R³ does not run",
    "-arch": "set CompileRequest.arch instead",
    "--gpu-architecture": "set CompileRequest.arch instead",
    "-code": "set CompileRequest.arch instead",
    "-gencode": "set CompileRequest.arch instead",
    "-D": "pass defines through CompileRequest.defines",
    "--define-macro": "pass defines through CompileRequest.defines",
    "-I": "pass include directories through CompileRequest.include_dirs",
    "--include-path": "pass include directories through CompileRequest.include_dirs",
    "-o": "R³ chooses the output itself",
    "-ptx": "R³ builds cubins for the exact arch, never PTX",
    "-cubin": "R³ builds cubins itself",
}
# ptxas switches that R³ always passes (-v: the resource report) and therefore drops.
_PTXAS_IMPLIED = frozenset({"-v", "--verbose"})
_PTXAS_SPELLINGS = ("-Xptxas", "--ptxas-options")
_OPT_LEVEL = re.compile(r"^-O([0-9])$")


def accepted_options(toolchain_name: str) -> tuple[OptionSpec, ...]:
    """Every option ``toolchain_name`` accepts, in table order, for building a search space."""
    _check_toolchain(toolchain_name)
    return tuple(spec for spec in SPECS if toolchain_name in spec.toolchains)


def option_spec(name: str) -> OptionSpec:
    """The spec of the canonical option ``name`` (``"maxrregcount"``, ``"opt-level"``, ...)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ConfigError(f"no compiler option named {name!r}") from None


def canonicalize(toolchain_name: str, options: Sequence[str]) -> Canonical:
    """Parse ``options`` into sorted ``(name, value)`` pairs; :class:`ConfigError` on any
    option the toolchain does not accept, a bad value, or two different values for one option.
    """
    _check_toolchain(toolchain_name)
    found: dict[str, str] = {}
    tokens = list(options)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if token in _PTXAS_SPELLINGS:
            if index >= len(tokens):
                raise ConfigError(f"compiler option {token} needs a value")
            _add_ptxas(found, tokens[index], toolchain_name)
            index += 1
            continue
        head, sep, tail = token.partition("=")
        if head in _PTXAS_SPELLINGS and sep:
            _add_ptxas(found, tail, toolchain_name)
            continue
        level = _OPT_LEVEL.match(token)
        if level:
            _add(found, _BY_NAME["opt-level"], level.group(1), token)
            continue
        spec = _FRONTEND.get(head)
        if spec is None:
            raise _unknown(token, toolchain_name)
        if spec.kind != "flag" and not sep:
            # nvcc and NVRTC both take "--maxrregcount 64" as well as "--maxrregcount=64".
            if index >= len(tokens):
                raise ConfigError(f"compiler option {token} needs a value")
            tail = tokens[index]
            index += 1
        if toolchain_name not in spec.toolchains:
            raise _unknown(token, toolchain_name)
        _add(found, spec, tail, token)
    return tuple(sorted(found.items(), key=lambda item: _ORDER[item[0]]))


def render(toolchain_name: str, canonical: Canonical) -> list[str]:
    """Command-line tokens for ``canonical`` (NVRTC and nvcc accept the same spelling; for
    ``llvm`` these are the request's spelling, which r3tui.compile.llvm translates)."""
    _check_toolchain(toolchain_name)
    return [_render(_BY_NAME[name], value) for name, value in canonical]


def _render(spec: OptionSpec, value: str) -> str:
    if spec.ptxas:
        # One --ptxas-options per switch: NVRTC hands the whole value to ptxas as one
        # argument, so a comma list ("-O3,-dlcm=cg") breaks there although nvcc splits it.
        if spec.name == "opt-level":
            return f"--ptxas-options=-O{value}"
        inner = spec.spellings[0] if spec.kind == "flag" else f"{spec.spellings[0]}={value}"
        return f"--ptxas-options={inner}"
    return spec.spellings[0] if spec.kind == "flag" else f"{spec.spellings[0]}={value}"


def _add_ptxas(found: dict[str, str], value: str, toolchain_name: str) -> None:
    # nvcc splits -Xptxas values on commas; do the same so both toolchains see one switch each.
    for item in (part.strip() for part in value.split(",")):
        if not item or item in _PTXAS_IMPLIED:
            continue
        level = _OPT_LEVEL.match(item)
        if level:
            _add(found, _BY_NAME["opt-level"], level.group(1), item)
            continue
        head, sep, tail = item.partition("=")
        spec = _PTXAS.get(head)
        if spec is not None and toolchain_name not in spec.toolchains:
            spec = None
        if spec is None or (spec.kind != "flag" and not sep):
            names = ", ".join(
                s.spellings[0] for s in SPECS if s.ptxas and toolchain_name in s.toolchains
            )
            raise ConfigError(
                f"ptxas option {item!r} is not accepted",
                hint=f"accepted through -Xptxas: -v, {names} (write values as -dlcm=cg)",
            )
        _add(found, spec, tail, item)


def _add(found: dict[str, str], spec: OptionSpec, value: str, token: str) -> None:
    value = spec.check(value)
    previous = found.get(spec.name)
    if previous is not None and previous != value:
        raise ConfigError(
            f"compiler option {spec.spellings[0]} given twice with different values "
            f"({previous!r} and {value!r} from {token!r})"
        )
    found[spec.name] = value


def _unknown(token: str, toolchain_name: str) -> ConfigError:
    head = token.partition("=")[0]
    reason = _REFUSED.get(head) or (_REFUSED.get(token[:2]) if token[:2] in ("-D", "-I") else None)
    if reason:
        return ConfigError(f"compiler option {token!r} is not allowed: {reason}")
    names = ", ".join(spec.spellings[0] for spec in accepted_options(toolchain_name))
    return ConfigError(
        f"compiler option {token!r} is not accepted by {toolchain_name}",
        hint=f"accepted: {names}, -O<n>, -Xptxas <ptxas option>",
    )


def _check_toolchain(name: str) -> None:
    if name not in TOOLCHAIN_NAMES:
        raise ConfigError(
            f"unknown toolchain {name!r}", hint=f"known toolchains: {', '.join(TOOLCHAIN_NAMES)}"
        )


def describe(specs: Iterable[OptionSpec]) -> list[str]:
    """One line per option, for ``r3 doctor`` and help texts."""
    lines = []
    for spec in specs:
        if spec.kind == "int":
            domain = f"{spec.low}..{spec.high}"
        elif spec.kind == "choice":
            domain = "|".join(spec.values)
        else:
            domain = "flag"
        where = "ptxas " if spec.ptxas else ""
        lines.append(f"{where}{spec.spellings[0]} ({domain}): {spec.help}")
    return lines
