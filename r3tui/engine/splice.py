"""Where an application's kernel is in its source tree, and the edits ``r3 apply`` and
``r3 export`` make there: the file that defines the kernel (the recorded unit, or for a campaign
on a device unit the header or unit the definition came from), the definition's span, the
definition spliced in, and the ``#ifndef``-guarded macro the host code launches it with.
"""

from __future__ import annotations

import re
from pathlib import Path

from r3tui.analysis.text import split_top_level

EXPORTS_DIR = "r3-exports"
_SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp")


def find_unit(tree: Path, original: str, hint: str | None) -> Path | None:
    """The file of ``tree`` whose text is the campaign's recorded translation unit; else the
    one named like the bundle's source (``hint``)."""
    candidates = sorted(
        p
        for p in tree.rglob("*")
        if p.suffix in _SOURCE_SUFFIXES
        and p.is_file()
        and EXPORTS_DIR not in p.relative_to(tree).parts
    )
    for path in candidates:
        if path.read_text(errors="replace") == original:
            return path
    if hint:
        named = [p for p in candidates if p.name == Path(hint).name]
        if len(named) == 1:
            return named[0]
    return None


def _kernel_parts(kernel: str) -> tuple[tuple[str, ...], str]:
    """``cg::dot<256>`` -> (("cg",), "dot"); a mangled name is read with the record layer."""
    from r3tui.record.sources import qualified_name

    if kernel.startswith("_Z"):
        q = qualified_name(kernel)
        if q is not None:
            return q.scopes, q.name
    base = re.sub(r"<.*", "", kernel).strip()
    parts = [p for p in base.split("::") if p]
    return tuple(parts[:-1]), parts[-1] if parts else kernel


def definition_span(text: str, kernel: str) -> tuple[int, int] | None:
    """Where the one definition of ``kernel`` (in its namespaces) is in ``text``; None when
    there is none or more than one."""
    from r3tui.record.sources import definitions

    scopes, name = _kernel_parts(kernel)
    defs = [d for d in definitions(text, name) if not scopes or d.scopes == scopes]
    return (defs[0].start, defs[0].end) if len(defs) == 1 else None


def splice_definition(tree_text: str, variant_text: str, kernel: str) -> str | None:
    """``tree_text`` with the kernel's definition taken from ``variant_text`` (less the R3
    declarations the search added to it); None when either has no unique definition of it."""
    here, there = definition_span(tree_text, kernel), definition_span(variant_text, kernel)
    if here is None or there is None:
        return None
    from r3tui.search.source import without_directives

    # an R3 declaration (`// r3: tune NAME ...`) a rule put inside the kernel is the search's,
    # not the application's (its value ships as -DNAME=v in r3-flags.txt)
    definition = variant_text[there[0] : there[1]]
    original = tree_text[here[0] : here[1]]
    if without_directives(original) == original:  # the application's own are kept
        definition = without_directives(definition)
    return tree_text[: here[0]] + definition + tree_text[here[1] :]


def _launches(masked: str, name: str) -> list[tuple[int, int]]:
    """Where the ``name<<<...>>>`` launch configurations of ``masked`` (comments and literals
    blanked) are: the spans between ``<<<`` and ``>>>``."""
    return [span for span, _ in _qualified_launches(masked, name)]


def _qualified_launches(masked: str, name: str) -> list[tuple[tuple[int, int], tuple[str, ...]]]:
    """:func:`_launches` with the scopes each launch names the kernel with (``ns::k<<<``:
    ``("ns",)``; unqualified: ``()``)."""
    found = []
    pattern = rf"((?:\w+\s*::\s*)*)\b{re.escape(name)}\s*(?:<[^;{{}}()]*?>)?\s*<<<"
    for match in re.finditer(pattern, masked):
        end = masked.find(">>>", match.end())
        if end > 0:
            scopes = tuple(part.strip() for part in match.group(1).split("::") if part.strip())
            found.append(((match.end(), end), scopes))
    return found


def block_macro(text: str, kernel: str) -> tuple[str, str] | None:
    """The ``#ifndef``-guarded macro that gives the kernel's block size at its launches, and
    its default; None when the launches use anything else or disagree."""
    from r3tui.analysis.text import mask

    _, name = _kernel_parts(kernel)
    masked = mask(text)
    used: set[str] = set()
    for start, end in _launches(masked, name):
        arguments = split_top_level(masked[start:end])
        used.add(arguments[1].strip() if len(arguments) > 1 else "")
    if len(used) != 1:
        return None
    macro = used.pop()
    guarded = re.search(
        rf"#\s*ifndef\s+{re.escape(macro)}\s*\n\s*#\s*define\s+{re.escape(macro)}\s+(\S+)", masked
    )
    return (macro, guarded.group(1)) if guarded else None


def inject_maxnreg(definition: str, kernel: str, registers: int) -> str | None:
    """``definition`` (one kernel's definition) with ``__maxnreg__(registers)`` before its
    name: the register cap of ``-maxrregcount`` for this kernel alone.  None when the kernel
    carries ``__launch_bounds__`` (CUDA refuses both on one kernel) or is not found once."""
    from r3tui.analysis.kernels import kernel_definitions

    _, name = _kernel_parts(kernel)
    found = kernel_definitions(definition, name)
    if len(found) != 1:
        return None
    d = found[0]
    if "__launch_bounds__" in definition[d.start : d.body_open]:
        return None
    head = re.sub(r"__maxnreg__\s*\([^()]*\)\s*", "", definition[d.start : d.name_at])
    return definition[: d.start] + head + f"__maxnreg__({registers}) " + definition[d.name_at :]


def bake_define(definition: str, name: str, value: str) -> str | None:
    """``definition`` with its ``#ifndef name`` / ``#define name <v>`` set to ``value``, where
    the kernel's definition holds that guard (a tunable a rule declared inside the kernel);
    None where it does not, and the value must come from a -D flag instead."""
    pattern = re.compile(
        rf"(^[ \t]*#[ \t]*ifndef[ \t]+{re.escape(name)}[ \t]*\n[ \t]*#[ \t]*define[ \t]+"
        rf"{re.escape(name)}[ \t]+)(\S+)", re.M)
    if len(pattern.findall(definition)) != 1:
        return None
    return pattern.sub(lambda m: m.group(1) + value, definition)


# the grid of a launch whose threads each cover several elements (a rule's work_per_thread),
# or share one (threads_per_item): the application's own grid, scaled the way replay derives
# it from the recorded work
SCALED_GRID = "r3_scaled_grid"
_SCALED_GRID_HELPER = f"""#ifndef R3_SCALED_GRID
#define R3_SCALED_GRID
// r3 apply: the launches of a kernel whose threads cover several elements each (or share one)
// take the application's grid scaled by these factors (docs/app-apply.md)
// (host and device: a launch from device code, with dynamic parallelism, takes it too)
static inline __host__ __device__ dim3 {SCALED_GRID}(
    dim3 g, unsigned mx, unsigned my, unsigned mz, unsigned dx, unsigned dy, unsigned dz) {{
  return dim3((g.x * mx + dx - 1) / dx, (g.y * my + dy - 1) / dy, (g.z * mz + dz - 1) / dz);
}}
#endif
"""

EXACT_GRID = "r3_exact_grid"
# for a kernel that never bounds its index along some axes (`// r3: exact`): the scaled grid
# must cover the application's work exactly there, or the kernel runs past its arrays; a
# launch whose grid does not divide stops the program with one line instead
_EXACT_GRID_HELPER = f"""#ifndef R3_EXACT_GRID
#define R3_EXACT_GRID
#include <cstdio>
#include <cstdlib>
// r3 apply: {SCALED_GRID}, for a kernel tuned to cover the work exactly along the axes marked
// ex, ey, ez: it never checks its index against a bound there (docs/app-apply.md)
static inline __host__ __device__ dim3 {EXACT_GRID}(
    dim3 g, unsigned mx, unsigned my, unsigned mz, unsigned dx, unsigned dy, unsigned dz,
    unsigned ex, unsigned ey, unsigned ez) {{
  if ((ex && g.x * mx % dx) || (ey && g.y * my % dy) || (ez && g.z * mz % dz)) {{
#ifdef __CUDA_ARCH__
    __trap();
#else
    fprintf(stderr, "r3 apply: a launch's grid (%u, %u, %u) does not divide by the elements "
            "a thread of the tuned kernel covers (%u, %u, %u); it would run past its "
            "arrays, so the program stops (docs/app-apply.md)\\n", g.x, g.y, g.z, dx, dy, dz);
    abort();
#endif
  }}
  return {SCALED_GRID}(g, mx, my, mz, dx, dy, dz);
}}
#endif
"""

SHAPED_GRID = "r3_shaped_grid"
# the launches of a kernel tuned with another block shape than the host code's: that block,
# and the grid that covers the threads the application's own grid and block launched (scaled
# where a thread of the tuned kernel covers several elements or shares one), as replay derives
# it from the recorded work; along an axis where the kernel never bounds its index the grid
# must cover that work exactly, or the program stops with one line
_SHAPED_GRID_HELPER = f"""#ifndef R3_SHAPED_GRID
#define R3_SHAPED_GRID
#include <cstdio>
#include <cstdlib>
// r3 apply: the grid for a launch that takes the tuned block nb instead of the application's
// block b: it covers the threads g * b did, times m / d along each axis (docs/app-apply.md)
static inline __host__ __device__ dim3 {SHAPED_GRID}(
    dim3 g, dim3 b, dim3 nb, unsigned mx, unsigned my, unsigned mz, unsigned dx, unsigned dy,
    unsigned dz, unsigned ex, unsigned ey, unsigned ez) {{
  unsigned long long wx = (unsigned long long)g.x * b.x * mx;
  unsigned long long wy = (unsigned long long)g.y * b.y * my;
  unsigned long long wz = (unsigned long long)g.z * b.z * mz;
  unsigned long long tx = (wx + dx - 1) / dx, ty = (wy + dy - 1) / dy, tz = (wz + dz - 1) / dz;
  if ((ex && (wx % dx || tx % nb.x)) || (ey && (wy % dy || ty % nb.y)) ||
      (ez && (wz % dz || tz % nb.z))) {{
#ifdef __CUDA_ARCH__
    __trap();
#else
    fprintf(stderr, "r3 apply: a launch of (%u, %u, %u) blocks of (%u, %u, %u) threads does not "
            "divide into blocks of (%u, %u, %u) threads covering (%u, %u, %u) elements each; "
            "the tuned kernel would run past its arrays, so the program stops "
            "(docs/app-apply.md)\\n", g.x, g.y, g.z, b.x, b.y, b.z, nb.x, nb.y, nb.z, dx, dy, dz);
    abort();
#endif
  }}
  return dim3((unsigned)((tx + nb.x - 1) / nb.x), (unsigned)((ty + nb.y - 1) / nb.y),
              (unsigned)((tz + nb.z - 1) / nb.z));
}}
#endif
"""

_OTHER_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchCooperativeKernel", "cudaLaunchKernelEx",
                   "cuLaunchKernel", "cudaGraphAddKernelNode")


def grid_launches(text: str, kernel: str) -> tuple[int, str | None]:
    """How many ``<<<...>>>`` launches of ``kernel`` ``text`` holds, and why its grid cannot be
    rescaled there (None: every launch of it in ``text`` is one :func:`scale_launch_grids` can
    rewrite).  A launch API that names the kernel, or none at all, leaves the grid to the host
    code as it is."""
    from r3tui.analysis.text import mask

    scopes, name = _kernel_parts(kernel)
    masked = mask(text)
    launches = _qualified_launches(masked, name)
    count = len(launches)
    for _, named in launches:
        # `other::k<<<` where the kernel is `ns::k`: another kernel of that name, whose grid
        # must stay (an unqualified launch is taken to be this kernel's; `ns::k` and
        # `outer::ns::k` name it when its scopes end so)
        if named and (len(named) > len(scopes) or tuple(scopes[-len(named):]) != named):
            return count, (f"the host code also launches {'::'.join(named)}::{name}, "
                           f"another kernel named {name}")
    for api in _OTHER_LAUNCHES:
        for match in re.finditer(rf"\b{api}\b", masked):
            statement = masked[match.end() : masked.find(";", match.end())]
            if re.search(rf"\b{re.escape(name)}\b", statement):
                return count, f"the host code launches {name} through {api}"
    if count == 0:
        return 0, f"no `{name}<<<...>>>` launch in the host code"
    return count, None


def reshape_reason(text: str, kernel: str) -> str | None:
    """Why ``r3 apply`` could not give ``kernel``'s launches in ``text`` another block shape
    (:func:`scale_launch_grids` with ``block``); None where it can: every launch is a
    ``<<<grid, block>>>`` it can rewrite (:func:`grid_launches`) with no dynamic shared
    memory, whose size the host code may compute from the block it launches."""
    from r3tui.analysis.text import mask

    reason = grid_launches(text, kernel)[1]
    if reason is not None:
        return reason
    masked = mask(text)
    for start, end in _launches(masked, _kernel_parts(kernel)[1]):
        arguments = split_top_level(masked[start:end])
        line = text.count("\n", 0, start) + 1
        if len(arguments) < 2:
            return f"its launch at line {line} names no block"
        shared = arguments[2].strip() if len(arguments) > 2 else "0"
        if not re.fullmatch(r"0[uUlL]*", shared):
            return (f"its launch at line {line} passes {' '.join(shared.split())} bytes of "
                    "dynamic shared memory, which may follow the block it launches")
    return None


def scale_launch_grids(text: str, kernel: str, multipliers: tuple[int, int, int],
                       divisors: tuple[int, int, int], exact: tuple[str, ...] = (),
                       block: tuple[int, int, int] | None = None
                       ) -> tuple[str, int] | None:
    """``text`` with the grid of every ``kernel<<<grid, ...>>>`` launch multiplied by
    ``multipliers`` and divided (rounding up) by ``divisors`` per axis, through a helper put
    at the top of the file, and how many launches changed; None where :func:`grid_launches`
    finds a launch it cannot rewrite, or none.  ``exact``: axes the kernel never bounds its
    index along; there the helper stops the program where a grid does not divide.

    ``block``: the tuned block shape, launched instead of the host code's (None where
    :func:`reshape_reason` says it cannot be); the grid then covers the threads the host
    code's grid and block did, scaled alike (:data:`SHAPED_GRID`)."""
    from r3tui.analysis.text import mask

    reason = (reshape_reason(text, kernel) if block is not None
              else grid_launches(text, kernel)[1])
    if reason is not None:
        return None
    factors = ", ".join(str(int(f)) for f in (*multipliers, *divisors))
    flags = ", ".join("1" if a in exact else "0" for a in "xyz")
    shape = None if block is None else "dim3({}, {}, {})".format(*(int(v) for v in block))
    masked = mask(text)
    spans = _launches(masked, _kernel_parts(kernel)[1])
    for start, end in reversed(spans):  # later spans first: earlier offsets stay valid
        # masking keeps offsets, so the arguments' cuts hold in ``text``
        arguments = split_top_level(masked[start:end])
        cut = start + len(arguments[0])
        grid = text[start:cut].strip()
        if shape is None:  # the grid alone
            new = (f"{EXACT_GRID}(dim3({grid}), {factors}, {flags})" if exact
                   else f"{SCALED_GRID}(dim3({grid}), {factors})")
        else:  # the grid and the block
            launched = text[cut + 1:cut + 1 + len(arguments[1])].strip()
            cut += 1 + len(arguments[1])
            new = (f"{SHAPED_GRID}(dim3({grid}), dim3({launched}), {shape}, {factors}, "
                   f"{flags}), {shape}")
        text = text[:start] + new + text[cut:]
    # each helper once a file, the shaped one for a block, the exact one over the scaled one
    if shape is not None:
        return (text if "#define R3_SHAPED_GRID\n" in text else _SHAPED_GRID_HELPER + text,
                len(spans))
    if exact and "#define R3_EXACT_GRID\n" not in text:
        text = _EXACT_GRID_HELPER + text
    if "#define R3_SCALED_GRID\n" not in text:
        text = _SCALED_GRID_HELPER + text
    return text, len(spans)
