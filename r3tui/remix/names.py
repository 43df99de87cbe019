"""The names a model's REPLACE text may use, checked token by token while it is generated.

The commonest way a small model's edit fails to compile is a name that does not exist: one it
copied from a worked example of the prompt (``p``, ``pj``, ``buf``, ``scale``) or made up, used
where nothing declares it.  Qwen2.5-Coder-1.5B's generate-only answers on nbody and
reduce_sum (session 39, 119 proposals): 35 of the 97 that failed failed on an undefined
identifier, more than on anything else.

:class:`IdentifierCheck` is asked, for each token the sampler draws, whether appending it to
the answer leaves every identifier of the answer's REPLACE sections one that exists:

- a name of the unit being edited (every identifier of its text, host code included: the
  check errs towards allowing), a C++ or CUDA keyword, type, builtin or math function, a
  header's macro (``NAN``, ``FLT_MAX``) only where the unit includes that header; but not a
  name whose only declaration is in the edit's SEARCH text, which the edit removes;
- a name the answer declares: the identifier after a type (``float acc2``, ``float4 *v``,
  ``const int n2``), after a comma in a declaration (``int a = 0, b``), a ``#define``'s name
  and parameters; usable from there on;
- a member after ``.``, ``->`` or ``::``, which the check does not know.

A name still being written is allowed while it is the start of an allowed one (or declared).
A token is refused only when it makes more violations than the answer had before it, so an
answer is never stuck on what it wrote under another check.

Blocks count too (session 48: three of Qwen's seven compile failures of session 47 were of
this kind): a name the REPLACE text declares inside a block it closes is gone after the
block; a declaration at the edit's own level of a name the enclosing block declares outside
the SEARCH text (or the function's parameters, or a ``for``'s) counts, as the compiler's
"has already been declared" would (``const float eps2`` in nbody, ``block`` in reduce_sum);
and the end line of a section is refused while a name its SEARCH text declared, and the code
after it uses, is not declared again at the edit's level (``pi`` declared in a loop's body,
used after the loop).  Everything else (types, the scopes of other statements) is left to the
compiler.

The check runs in the llama.cpp backend's sampler (:class:`~r3tui.remix.llama_cpp_backend.
GrammarCheckedSampler`), after the grammar: a backend that samples elsewhere (a server) cannot
run it and ignores it.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Iterable
from pathlib import Path

from r3tui.analysis.facts import tokens
from r3tui.analysis.text import mask
from r3tui.remix.balance import balance, ended_by, lowest
from r3tui.remix.edits import DIVIDER, REPLACE_MARK, SEARCH_MARK


def _words(text: str) -> list[str]:
    return text.split()


# C++ keywords and the words of preprocessor lines
KEYWORDS = frozenset(_words("""
alignas alignof asm auto bool break case catch char char16_t char32_t class const constexpr
const_cast continue decltype default delete do double dynamic_cast else enum explicit extern
false float for friend goto if inline int long mutable namespace new noexcept nullptr operator
private protected public register reinterpret_cast return short signed sizeof static
static_assert static_cast struct switch template this throw true try typedef typeid typename
union unsigned using virtual void volatile while
define undef include ifdef ifndef elif endif defined pragma unroll once error warning line
"""))

# CUDA's own words, types and the device functions kernels commonly call
BUILTINS = frozenset(_words("""
__global__ __device__ __host__ __shared__ __constant__ __restrict__ __forceinline__
__noinline__ __launch_bounds__ __managed__ __grid_constant__
threadIdx blockIdx blockDim gridDim warpSize dim3
__syncthreads __syncwarp __threadfence __threadfence_block __syncthreads_or __syncthreads_and
__syncthreads_count __shfl_sync __shfl_up_sync __shfl_down_sync __shfl_xor_sync __ballot_sync
__any_sync __all_sync __activemask __popc __clz __ffs __ldg __ldcg __ldca __ldcs __stcg
__fmaf_rn __fmul_rn __fadd_rn __fdividef __expf __logf __sinf __cosf __powf __saturatef
__float2int_rn __int2float_rn __half __half2 half half2 __float2half __half2float __nv_bfloat16
atomicAdd atomicSub atomicMax atomicMin atomicExch atomicCAS atomicAnd atomicOr atomicXor
char1 char2 char3 char4 uchar1 uchar2 uchar3 uchar4 short1 short2 short3 short4 ushort2 ushort4
int1 int2 int3 int4 uint1 uint2 uint3 uint4 long1 long2 long3 long4 ulong2 ulong4 longlong2
float1 float2 float3 float4 double1 double2 double3 double4 uint
make_int2 make_int3 make_int4 make_uint2 make_uint3 make_uint4 make_float2 make_float3
make_float4 make_double2 make_double3 make_double4
size_t ptrdiff_t int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t
min max abs fabs fabsf fmin fminf fmax fmaxf fma fmaf sqrt sqrtf rsqrt rsqrtf cbrt cbrtf
exp expf exp2 exp2f exp10f expm1f log logf log2 log2f log10 log10f log1pf pow powf sin sinf
cos cosf tan tanf sincosf asin asinf acos acosf atan atanf atan2 atan2f sinh sinhf cosh coshf
tanh tanhf erf erff erfc erfcf floor floorf ceil ceilf round roundf rint rintf trunc truncf
fmod fmodf copysign copysignf hypot hypotf isnan isinf isfinite signbit
"""))

# Names a header defines, allowed only where the unit includes one of those headers (or uses
# the name itself).  NVRTC compiles a unit without them: SmolLM2-135M's answers used NAN in 6
# of 24 (session 43), each "identifier "NAN" is undefined".  cuda_runtime.h and cuda.h bring
# math.h with them under nvcc.
HEADER_NAMES: dict[tuple[str, ...], frozenset[str]] = {
    ("math.h", "cmath", "cuda_runtime.h", "cuda.h"): frozenset(
        _words("INFINITY NAN HUGE_VALF HUGE_VAL M_PI")),
    ("float.h", "cfloat"): frozenset(
        _words("FLT_MAX FLT_MIN FLT_EPSILON DBL_MAX DBL_MIN DBL_EPSILON")),
    ("limits.h", "climits"): frozenset(_words("INT_MAX INT_MIN UINT_MAX")),
    ("math_constants.h",): frozenset(_words("CUDART_INF_F CUDART_PI_F CUDART_NAN_F")),
    ("limits",): frozenset(_words("std numeric_limits")),
    ("cmath", "utility", "algorithm"): frozenset(_words("std swap")),
}
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)

# words after which an identifier is not being declared (``return x``, ``else y``)
_NOT_A_TYPE = frozenset(_words("""
return else case goto sizeof alignof new delete throw do typedef using namespace co_return
co_yield co_await decltype operator
"""))
# types and qualifiers that may stand before ``*`` or ``&`` in a declaration (``float *p``)
_TYPE_WORDS = frozenset(_words("""
bool char short int long float double signed unsigned void auto size_t const volatile
__restrict__ __half __half2 half half2 __nv_bfloat16 uint dim3 ptrdiff_t
""")) | frozenset(w for w in BUILTINS if re.fullmatch(r"u?(char|short|int|long|longlong|"
                                                              r"float|double)[1-4]|u?int\d+_t",
                                                              w))

_LEX = re.compile(
    r"(?P<comment>//[^\n]*|/\*.*?(?:\*/|\Z))"
    r"|(?P<string>\"(?:\\.|[^\"\\\n])*\"?|'(?:\\.|[^'\\\n])*'?)"
    r"|(?P<number>\.?[0-9](?:[eEpP][+-]|[0-9A-Za-z_.])*)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<newline>\n)"
    r"|(?P<space>[ \t\r\f\v]+|\\\n)"
    r"|(?P<punct>->|::|.)",
    re.S,
)
_TYPE_NAMES = re.compile(r"\b(?:struct|class|union|enum(?:\s+class)?|typename)\s+([A-Za-z_]\w*)"
                         r"|\busing\s+([A-Za-z_]\w*)\s*=|\btypedef\b[^;]*?\b([A-Za-z_]\w*)\s*;")
_DIVIDER = DIVIDER + "\n"
_NAME = re.compile(r"\w+")
_SEARCH_START = SEARCH_MARK + "\n"
_REPLACE_END = REPLACE_MARK.split()[0]  # the end line's marker, before its word


def unit_names(source: str) -> frozenset[str]:
    """Every identifier of ``source``'s code (not of its comments and literals: a name only a
    comment mentions would not compile; numbers among them are never asked about), but one
    that appears only as a member (after ``.`` or ``->``): nbody's ``w`` of ``pj.w`` is no
    variable, and Qwen2.5-Coder's answers used ``w[k]`` and ``y[i2]`` so (session 43)."""
    found = tokens(source)
    return frozenset(t for i, t in enumerate(found)
                     if _NAME.fullmatch(t) and (i == 0 or found[i - 1] not in (".", "->")))


def unit_types(source: str) -> frozenset[str]:
    """Names ``source`` declares as types (struct, class, union, enum, using, typedef)."""
    return frozenset(name for match in _TYPE_NAMES.finditer(source) for name in match.groups()
                     if name)


def header_names(source: str) -> frozenset[str]:
    """The names of :data:`HEADER_NAMES` that ``source``'s includes bring (by the header's
    file name, wherever it is included from)."""
    included = {Path(name).name for name in _INCLUDE.findall(source)}
    return frozenset(name for headers, names in HEADER_NAMES.items()
                     if included.intersection(headers) for name in names)


def edit_sections(answer: str) -> list[tuple[str, str]]:
    """``(SEARCH text, REPLACE text)`` of each edit of a SEARCH/REPLACE answer that has
    reached its divider, the last REPLACE text possibly unfinished (a SEARCH text without
    its marker line: the answer's text before the divider)."""
    sections: list[tuple[str, str]] = []
    at = 0
    while True:
        start = answer.find(_DIVIDER, at)
        if start < 0 or (start > 0 and answer[start - 1] != "\n"):
            if start < 0:
                return sections
            at = start + len(_DIVIDER)
            continue
        opened = answer.rfind(_SEARCH_START, at, start)
        search = answer[opened + len(_SEARCH_START):start] if opened >= 0 else answer[at:start]
        start += len(_DIVIDER)
        end = answer.find("\n" + _REPLACE_END, start - 1)
        if end < 0:
            sections.append((search, answer[start:]))
            return sections
        sections.append((search, answer[start:end + 1]))
        at = end + 1


def replace_sections(answer: str) -> list[str]:
    """The text of each REPLACE section of a SEARCH/REPLACE answer, the last one possibly
    unfinished."""
    return [replace for _, replace in edit_sections(answer)]


def _parameters(code: str, brace: int) -> str:
    """The text inside the parentheses that end right before the block opened at ``brace``
    (a function's parameters, a ``for``'s header), or "" where none do; ``code`` is the
    unit masked (:func:`~r3tui.analysis.text.mask`), so comments and literals do not count."""
    end = len(code[:brace].rstrip()) - 1
    if end < 0 or code[end] != ")":
        return ""
    level = 0
    for i in range(end, -1, -1):
        level += {")": 1, "(": -1}.get(code[i], 0)
        if not level:
            return code[i + 1:end]
    return ""


def _enclosing_block(code: str, start: int, end: int) -> tuple[int, int] | None:
    """Where the innermost block around ``code[start:end]`` opens and closes (``code``
    masked), or None where that text stands outside every block."""
    opened: list[int] = []
    for i in range(start):
        if code[i] == "{":
            opened.append(i)
        elif code[i] == "}" and opened:
            opened.pop()
    if not opened:
        return None
    level = 0
    for i in range(end, len(code)):
        level += {"{": 1, "}": -1}.get(code[i], 0)
        if level < 0:
            return opened[-1], i
    return None


class IdentifierCheck:
    """Whether a next piece of text keeps the answer's REPLACE identifiers existing names.

    ``known``: the unit's names (:func:`unit_names`); ``types``: the unit's own type names,
    which may stand before ``*`` in a declaration as the builtin types do."""

    name = "identifiers"  # as the recorded call's sampling names the check

    def __init__(self, known: Iterable[str], types: Iterable[str] = (), unit: str = "") -> None:
        self._known = frozenset(known) | KEYWORDS | BUILTINS
        self._types = _TYPE_WORDS | frozenset(types)
        self._unit = unit  # the unit's text, for what a SEARCH text's removal takes away
        self.refused = 0  # pieces refused (the sampler's count of what the check changed)

    @classmethod
    def for_unit(cls, source: str) -> IdentifierCheck:
        return cls(unit_names(source) | header_names(source), unit_types(source), source)

    def __call__(self, answer: str, piece: str) -> bool:
        ending = ended_by(answer, piece)
        if ending is not None:
            ok = not self.missing(*ending)
        elif not piece or not self._in_replace(answer + piece):
            return True
        else:
            ok = self.violations(answer + piece) <= self.violations(answer)
        if not ok:
            self.refused += 1
        return ok

    def missing(self, search: str, replace: str) -> frozenset[str]:
        """The names ``search`` declares (:meth:`removed_by`) that the unit's code after it
        uses and ``replace`` does not declare again at its own level."""
        needed = self._needed_after(search)
        if not needed:
            return frozenset()
        visible: set[str] = set()
        self._scan(replace, visible, unfinished=False, scoped=True)
        return needed - visible

    @functools.lru_cache(maxsize=16)  # noqa: B019 - one instance per answer, a few entries
    def _needed_after(self, search: str) -> frozenset[str]:
        removed = self.removed_by(search)
        if not removed:
            return frozenset()
        after = self._unit[self._unit.index(search) + len(search):]
        return removed & frozenset(m.group() for m in _LEX.finditer(after)
                                   if m.lastgroup == "ident")

    @functools.lru_cache(maxsize=16)  # noqa: B019 - one instance per answer, a few entries
    def clashes(self, search: str) -> frozenset[str]:
        """Names a declaration at the level of the edit of ``search`` would declare twice:
        those the block around it declares outside it at its own level, and those of the
        parenthesized list before that block (a function's parameters, a ``for``'s counter).
        Empty where ``search`` is not the unit's verbatim, does not balance its braces, or
        stands outside every block."""
        unit = self._unit
        if (not search.strip() or not unit or search not in unit
                or balance(search)[0] or lowest(search)[0]):
            return frozenset()
        code = mask(unit)
        at = unit.index(search)
        block = _enclosing_block(code, at, at + len(search))
        if block is None:
            return frozenset()
        names: set[str] = set()
        for text in (unit[block[0] + 1:at], unit[at + len(search):block[1]],
                     _parameters(code, block[0])):
            self._scan(text, names, unfinished=False, scoped=True)
        # a type the scan took for a name (``float`` after ``const``) is not one
        return frozenset(names - KEYWORDS - BUILTINS - self._types)

    @staticmethod
    def _in_replace(text: str) -> bool:
        divider = text.rfind("\n" + _DIVIDER)
        if divider < 0 and not text.startswith(_DIVIDER):
            return False
        return text.rfind("\n" + _REPLACE_END) < divider

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one instance per answer, a few entries
    def violations(self, answer: str) -> int:
        """Identifiers of ``answer``'s REPLACE sections that are neither known, declared
        before (in any REPLACE section, and not in a block closed since), members, nor (the
        last, unfinished one) the start of an allowed name; and declarations at the edit's
        level of a name it would declare twice (:meth:`clashes`)."""
        declared: set[str] = set()
        count = 0
        sections = edit_sections(answer)
        for k, (search, section) in enumerate(sections):
            # a finished section ends with its newline, so only the last can end in a name
            count += self._scan(section, declared, unfinished=k == len(sections) - 1,
                                removed=self.removed_by(search),
                                clashes=self.clashes(search), scoped=True)
        return count

    @functools.lru_cache(maxsize=16)  # noqa: B019 - one instance per answer, a few entries
    def removed_by(self, search: str) -> frozenset[str]:
        """Names the SEARCH text declares and the unit declares nowhere else: replacing that
        text takes their declarations away, so its REPLACE text may use them only after
        declaring them again (session 43: SmolLM2's nbody answers used ``ax`` and ``r`` so,
        and the names check, which knew them as the unit's, let them through).  Empty where
        the text is not the unit's verbatim."""
        if not search.strip() or not self._unit or search not in self._unit:
            return frozenset()
        inside: set[str] = set()
        self._scan(search, inside, unfinished=False)
        elsewhere: set[str] = set()
        self._scan(self._unit.replace(search, "\n", 1), elsewhere, unfinished=False)
        return frozenset(inside - elsewhere - KEYWORDS - BUILTINS)

    def _scan(self, text: str, declared: set[str], unfinished: bool,
              removed: frozenset[str] = frozenset(), clashes: frozenset[str] = frozenset(),
              scoped: bool = False) -> int:
        """Count ``text``'s violations, adding what it declares to ``declared``; ``scoped``:
        a name declared in a block ``text`` opens leaves ``declared`` when the block closes,
        and a declaration outside every bracket and block of ``text`` of a name in
        ``clashes`` counts."""
        count = 0
        blocks: list[set[str]] = []  # the names each block opened here declared first
        previous: tuple[str, str] = ("newline", "\n")  # the last significant token
        before: tuple[str, str] = ("newline", "\n")  # the one before it
        depth = 0  # parentheses and brackets
        declaring_at: int | None = None  # the depth of a declaration this statement makes
        define_line = False
        tokens = list(_LEX.finditer(text))
        for index, match in enumerate(tokens):
            kind, value = match.lastgroup or "punct", match.group()
            if kind in ("space", "comment"):
                continue
            if kind == "newline":
                define_line = False
                before, previous = previous, (kind, value)
                continue
            if kind == "punct":
                if value == "#":
                    define_line = previous[0] == "newline"
                elif value in "([":
                    depth += 1
                elif value in ")]":
                    depth = max(0, depth - 1)
                    if declaring_at is not None and depth < declaring_at:
                        declaring_at = None
                elif value in ";{}":
                    declaring_at = None
                    depth = 0 if value != ";" else depth
                    if value == "{":
                        blocks.append(set())
                    elif value == "}" and blocks:
                        gone = blocks.pop()
                        if scoped:
                            declared.difference_update(gone)
            elif kind == "ident":
                last = index == len(tokens) - 1 and unfinished
                member = previous[0] == "punct" and previous[1] in (".", "->", "::")
                declaring = (
                    (previous[0] == "ident" and previous[1] not in _NOT_A_TYPE
                     and previous[1] != "define")
                    or (previous[0] == "punct" and previous[1] in ("*", "&", "&&", "**")
                        and before[0] == "ident" and before[1] in self._types | declared)
                    or (previous == ("punct", ",") and declaring_at == depth)
                    or (define_line and previous[1] in ("define", "(", ","))
                )
                if declaring and not member:
                    if not last:
                        if blocks and value not in declared:
                            blocks[-1].add(value)
                        declared.add(value)
                        if (value in clashes and not blocks and not depth
                                and not define_line):
                            count += 1
                    if not define_line:
                        declaring_at = depth
                elif not (member or define_line or value in declared
                          or (value in self._known and value not in removed)
                          or (last and self._starts_a_name(value, declared, removed))):
                    count += 1
            before, previous = previous, (kind, value)
        return count

    def _starts_a_name(self, prefix: str, declared: set[str],
                       removed: frozenset[str] = frozenset()) -> bool:
        """Whether ``prefix`` starts a name the answer may use here: a known one that the
        edit does not remove (else the check would let ``pj`` be written and then refuse
        every token that ends it: Qwen's answers were left with such names when the check
        stood aside, session 43), or a declared one."""
        names = self._sorted()
        i = bisect.bisect_left(names, prefix)
        while i < len(names) and names[i].startswith(prefix):
            if names[i] not in removed:
                return True
            i += 1
        return any(name.startswith(prefix) for name in declared)

    @functools.cache  # noqa: B019 - one instance per answer
    def _sorted(self) -> list[str]:
        return sorted(self._known)
