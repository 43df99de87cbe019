"""The static checks on a candidate's source, run before anything compiles it.

A variant's text comes from a language model.  It must never reach the host: ``r3 apply``
splices a winner into the user's application, rebuilds it and runs it, so new or changed code
that can run on the host (a host function, a host global's dynamic initializer, a macro that
rewrites host code, a new host header) refuses the candidate.  And it must not be able to game
a benchmark that replays it many times: device-heap allocations outlive a launch where the
replay cannot reset them, and reads of clocks or of which SM a block runs on make results
irreproducible, so both refuse when the original's device code does not already do them.  New
mutable module-scope device state does not refuse: it is reported, by name, for the replay to
reset before every launch.

Everything is a comparison with the original, robust to comments and layout: the original may
itself have host code (an application's translation unit has ``main``), and unchanged code is
never a finding.  Identical sources give no findings.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from r3tui.analysis.cuda import (
    ExecutionSpace,
    Item,
    ItemKind,
    Macro,
    MemorySpace,
    TranslationUnit,
    parse_translation_unit,
    words,
)


class FindingKind(StrEnum):
    HOST_CODE = "host_code"
    INCLUDE = "include"
    HEAP = "heap"
    CLOCK = "clock"
    MODULE_STATE = "module_state"
    PARSE = "parse"


@dataclass(frozen=True)
class Finding:
    kind: FindingKind
    line: int  # 1-based line in the candidate
    message: str  # one line that names the construct
    refuses: bool  # True: the candidate must not be compiled


@dataclass(frozen=True)
class SafetyReport:
    findings: tuple[Finding, ...] = ()
    # the candidate's new mutable module-scope device variables ("ns::name") and function-scope
    # statics in device code ("function::name"): the replay resets these before every launch
    module_state: tuple[str, ...] = ()

    @property
    def refused(self) -> bool:
        return any(f.refuses for f in self.findings)

    @property
    def reason(self) -> str | None:
        messages = [f.message for f in self.findings if f.refuses]
        return "; ".join(messages[:3]) if messages else None


# Calls that never belong in a kernel: each starts a process, touches files, or reads the
# environment.  Refused anywhere in new code, so also where a host rule might miss them.
HOST_ONLY_CALLS = frozenset({
    "system", "popen", "execv", "execl", "execve", "execvp", "execlp", "execle", "execvpe",
    "fork", "vfork", "fopen", "freopen", "remove", "unlink", "rename", "dlopen", "getenv",
    "setenv", "putenv", "syscall",
})
HEAP_CALLS = frozenset({
    "malloc", "free", "calloc", "realloc", "cudaMalloc", "cudaFree",
    "__nv_aligned_device_malloc", "operator new", "operator delete",
})
CLOCK_CALLS = frozenset({"clock", "clock64", "__globaltimer", "globaltimer"})
# PTX special registers whose values depend on time or on where a block runs
_CLOCK_REGISTERS = re.compile(
    r"%{1,2}(globaltimer_lo|globaltimer_hi|globaltimer|clock64|clock_hi|clock|nsmid|smid|warpid)"
    r"\b")

# Headers a candidate may add: device functions and types, or constants and declarations only;
# nothing in them runs on the host by being included.  (Math headers are here because models
# add them for sqrtf/expf; a call they declare would need new host code, which refuses anyway.)
DEVICE_HEADERS = frozenset({
    "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h", "cooperative_groups.h", "cuda_pipeline.h",
    "cuda_awbarrier.h", "mma.h", "cuda/barrier", "cuda/pipeline", "cuda/annotated_ptr",
    "cuda_runtime.h", "device_launch_parameters.h", "math_constants.h", "vector_types.h",
    "vector_functions.h", "stdint.h", "cstdint", "climits", "cfloat", "type_traits",
    "limits.h", "float.h", "cmath", "math.h",
})
_DEVICE_HEADER_PREFIXES = ("cooperative_groups/", "cuda/std/", "cub/")
_INTRINSICS_HEADER = re.compile(r"sm_\w+_intrinsics\.h")


def check_candidate(original: str, candidate: str) -> SafetyReport:
    """Compare ``candidate`` with ``original`` and say whether it may be compiled."""
    before = parse_translation_unit(original)
    after = parse_translation_unit(candidate)
    new = _new_items(before, after)
    state, names = _module_state(before, after)
    findings = [
        *_host_code(before, after, new),
        *_macros(before, after, new),
        *_includes(before, after),
        *_heap(before, after),
        *_clock(before, after),
        *state,
        *_parse(before, after),
    ]
    return SafetyReport(findings=tuple(findings), module_state=names)


def is_device_header(target: str) -> bool:
    if target.startswith("/") or ".." in target.split("/"):
        return False  # a path out of the include directories reaches any file
    return (target in DEVICE_HEADERS or target.startswith(_DEVICE_HEADER_PREFIXES)
            or _INTRINSICS_HEADER.fullmatch(target) is not None)


def _new_items(before: TranslationUnit, after: TranslationUnit) -> list[Item]:
    """The candidate's items that the original does not have with the same normalised text.

    A multiset per (kind, name), so an overload added beside an unchanged one is new, and
    moving an item elsewhere in the file is not a change.
    """
    left = Counter((i.kind, i.qualified_name, i.text) for i in before.items)
    new: list[Item] = []
    for item in after.items:
        key = (item.kind, item.qualified_name, item.text)
        if left[key] > 0:
            left[key] -= 1
        else:
            new.append(item)
    return new


def _host_code(before: TranslationUnit, after: TranslationUnit, new: list[Item]
               ) -> Iterator[Finding]:
    known = {f.qualified_name for f in before.functions}
    macros = {m.name for m in (*before.macros, *after.macros)}
    for item in new:
        if item.kind is ItemKind.STATEMENT and _misplaced_code(item.text, macros):
            # an assignment or expression outside any function, naming no macro: the edit
            # closed a function early (a '}' too many), which the compiler rejects and a
            # repair turn can fix; nothing there can expand to host code
            yield Finding(FindingKind.PARSE, item.line,
                          f"statement '{_excerpt(item.text)}' at namespace scope (line "
                          f"{item.line}): code outside any function (the compiler will "
                          "report it)", refuses=False)
            continue
        yield from _host_item(item, known, before.defines_main)
        for call in item.calls:
            if call.name in HOST_ONLY_CALLS:
                yield _refuse(FindingKind.HOST_CODE, call.line,
                              f"call to '{call.name}' (line {call.line}) in new code")


def _host_item(item: Item, known: set[str | None], original_has_main: bool
               ) -> Iterator[Finding]:
    name, line = item.qualified_name, item.line
    if item.kind is ItemKind.FUNCTION and item.space is not None and item.space.on_host:
        what = ("host function" if item.space is ExecutionSpace.HOST
                else "__host__ __device__ function")
        status = "differs from the original" if name in known else "is not in the original"
        yield _refuse(FindingKind.HOST_CODE, line, f"{what} '{name}' (line {line}) {status}")
    elif item.kind is ItemKind.FUNCTION and item.defines_main and not original_has_main:
        yield _refuse(FindingKind.HOST_CODE, line,
                      f"function 'main' (line {line}) is not in the original")
    elif item.kind is ItemKind.DECLARATION and item.memory_space is None and item.dynamic_init:
        yield _refuse(FindingKind.HOST_CODE, line,
                      f"host global '{name}' (line {line}) is initialized at load time by "
                      f"{item.dynamic_init}")
    elif item.kind is ItemKind.TYPE and item.dynamic_init:
        yield _refuse(FindingKind.HOST_CODE, line,
                      f"type '{name}' (line {line}) has a member initializer with "
                      f"{item.dynamic_init}, which runs when the host constructs one")
    elif item.kind is ItemKind.ASM:
        yield _refuse(FindingKind.HOST_CODE, line,
                      f"asm at namespace scope (line {line}) is not in the original")
    elif item.kind is ItemKind.STATEMENT:
        yield _refuse(FindingKind.HOST_CODE, line,
                      f"statement '{_excerpt(item.text)}' at namespace scope (line {line}) is "
                      "not in the original; a macro there can expand to host code")
    elif item.kind is ItemKind.ERROR:
        hidden = sorted(words(item.text) & (HOST_ONLY_CALLS | {"main", "__host__"}))
        if hidden:
            yield _refuse(FindingKind.HOST_CODE, line,
                          f"text the parser could not read (line {line}) names '{hidden[0]}'")


def _macros(before: TranslationUnit, after: TranslationUnit, new: list[Item]
            ) -> Iterator[Finding]:
    """A new or changed #define must not rewrite what the original's host code says, nor
    carry host-only calls or a `main` into wherever it is expanded."""
    old = {(m.name, m.params, m.body) for m in before.macros}
    changed = [m for m in after.macros if (m.name, m.params, m.body) not in old]
    if not changed:
        return
    host_words = _host_words(before)
    for macro in changed:
        line = macro.line
        if macro.name in host_words:
            yield _refuse(FindingKind.HOST_CODE, line,
                          f"#define of '{macro.name}' (line {line}) changes a name the "
                          "original's host code uses")
        bad = sorted(words(macro.body) & (HOST_ONLY_CALLS | {"main"}))
        if bad:
            yield _refuse(FindingKind.HOST_CODE, line,
                          f"macro '{macro.name}' (line {line}) expands to '{bad[0]}'")
    yield from _code_macros_at_namespace_scope(new, changed)


def _code_macros_at_namespace_scope(new: list[Item], changed: list[Macro]
                                    ) -> Iterator[Finding]:
    """A new macro whose body is code (braces, asm) used outside any function defines
    something the parse cannot see, e.g. `#define EVIL int f() {...}` then `EVIL`."""
    code = {m.name for m in changed if words(m.body) & {"asm", "__asm__", "__asm"}
            or "{" in m.body.split()}
    if not code:
        return
    for item in new:
        if item.kind in (ItemKind.DECLARATION, ItemKind.ALIAS, ItemKind.ERROR):
            used = sorted(words(item.text) & code)
            if used:
                yield _refuse(FindingKind.HOST_CODE, item.line,
                              f"macro '{used[0]}' (line {item.line}) expands to code at "
                              "namespace scope")


def _host_words(unit: TranslationUnit) -> set[str]:
    """Identifiers in code that can run on the host, and in every macro body (a macro may be
    expanded in host code); the macros' own names and #if conditions are not host code."""
    found: set[str] = set()
    for item in unit.items:
        device_only = (item.kind is ItemKind.FUNCTION and item.space is not None
                       and not item.space.on_host) or (
            item.kind is ItemKind.DECLARATION and item.memory_space is not None)
        preprocessor = item.kind in (ItemKind.DEFINE, ItemKind.CONDITIONAL, ItemKind.INCLUDE,
                                     ItemKind.PRAGMA, ItemKind.DIRECTIVE)
        if not device_only and not preprocessor:
            found |= words(item.text)
    for macro in unit.macros:
        found |= words(macro.body) - set(macro.params or ())
    return found


def _includes(before: TranslationUnit, after: TranslationUnit) -> Iterator[Finding]:
    known = {i.target for i in before.includes}
    for include in after.includes:
        if include.target in known or (include.system and is_device_header(include.target)):
            continue
        shown = f"<{include.target}>" if include.system else f'"{include.target}"'
        yield _refuse(FindingKind.INCLUDE, include.line,
                      f"#include {shown} (line {include.line}) is not in the original and is "
                      "not a device header")


def _device_calls(unit: TranslationUnit) -> Iterator[tuple[str, str, int]]:
    """(name, function, line) of each call in code that runs on the device."""
    for call in unit.calls:
        if call.space is not None and call.space.on_device:
            yield call.name, call.function, call.line


def _heap(before: TranslationUnit, after: TranslationUnit) -> Iterator[Finding]:
    used = {name for name, _, _ in _device_calls(before)}
    for name, function, line in _device_calls(after):
        if name in HEAP_CALLS and name not in used:
            yield _refuse(FindingKind.HEAP, line,
                          f"'{function}' calls '{name}' (line {line}) in device code: "
                          "device-heap memory outlives a launch and the replay cannot reset it")


def _clock_reads(unit: TranslationUnit) -> Iterator[tuple[str, str, int]]:
    """(what, function, line) of each read of a clock or of a block's placement."""
    for call in unit.calls:
        if call.space is None or not call.space.on_device:
            continue
        if call.name in CLOCK_CALLS:
            yield call.name, call.function, call.line
        elif call.name == "now" and "chrono" in call.callee:  # cuda::std::chrono clocks
            yield call.callee, call.function, call.line
    for asm in unit.asm:
        if asm.space is not None and asm.space.on_device:
            for match in _CLOCK_REGISTERS.finditer(asm.text):
                yield f"%{match.group(1)}", asm.function, asm.line


def _clock(before: TranslationUnit, after: TranslationUnit) -> Iterator[Finding]:
    used = {what for what, _, _ in _clock_reads(before)}
    for what, function, line in _clock_reads(after):
        if what not in used:
            yield _refuse(FindingKind.CLOCK, line,
                          f"'{function}' reads '{what}' (line {line}) in device code: results "
                          "that depend on time or on where a block runs are not reproducible")


def _module_state(before: TranslationUnit, after: TranslationUnit
                  ) -> tuple[list[Finding], tuple[str, ...]]:
    findings: list[Finding] = []
    names: list[str] = []
    known = {v.qualified_name for v in before.variables}
    for var in after.variables:
        name, line = var.qualified_name, var.line
        if not var.mutable or name in known or var.memory_space not in (
                MemorySpace.DEVICE, MemorySpace.MANAGED):
            continue
        names.append(name)
        if var.memory_space is MemorySpace.MANAGED:
            findings.append(_refuse(
                FindingKind.MODULE_STATE, line,
                f"__managed__ variable '{name}' (line {line}) is not in the original: managed "
                "memory is not captured by the recording"))
        else:
            findings.append(Finding(
                FindingKind.MODULE_STATE, line,
                f"mutable __device__ variable '{name}' (line {line}) is not in the original; "
                "the replay resets it before every launch", refuses=False))
    known_statics = {s.qualified_name for s in before.statics}
    device_functions = {f.qualified_name for f in after.functions
                        if f.space is not None and f.space.on_device}
    for var in after.statics:
        name, line = var.qualified_name, var.line
        # a static __shared__ array is per block, like any __shared__ one: no state
        if (var.function in device_functions and var.mutable and name not in known_statics
                and var.memory_space is not MemorySpace.SHARED):
            names.append(name)
            findings.append(Finding(
                FindingKind.MODULE_STATE, line,
                f"function-scope static '{name}' (line {line}) keeps its value between "
                "launches; the replay resets it before every launch", refuses=False))
    return findings, tuple(names)


def _parse(before: TranslationUnit, after: TranslationUnit) -> Iterator[Finding]:
    left = Counter(e.text for e in before.parse_errors)
    for error in after.parse_errors:
        if left[error.text] > 0:
            left[error.text] -= 1
            continue
        yield Finding(FindingKind.PARSE, error.line,
                      f"parse error at line {error.line} near '{_excerpt(error.text)}' "
                      "(the compiler will report it)", refuses=False)


_CALL_LIKE = re.compile(r"\s*([A-Za-z_]\w*)\s*\(")
_KEYWORDS = frozenset({"for", "while", "if", "switch", "return", "do", "sizeof"})


def _misplaced_code(text: str, macros: set[str]) -> bool:
    """Whether a statement at namespace scope is plain code that no macro can turn into a
    definition: it names none of the unit's macros and does not start like a macro
    invocation (``NAME(...)``, which a header's macro could expand)."""
    call = _CALL_LIKE.match(text)
    return not (words(text) & macros) and (call is None or call.group(1) in _KEYWORDS)


def _refuse(kind: FindingKind, line: int, message: str) -> Finding:
    return Finding(kind=kind, line=line, message=message, refuses=True)


def _excerpt(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
