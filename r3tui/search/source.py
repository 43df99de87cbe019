"""What a kernel variant's source declares for the search, and the text edits a config needs.

A variant declares compile-time parameters and relations between them in ``// r3:`` comments::

    // r3: tune TILE 8 16 32
    #ifndef TILE
    #define TILE 16
    #endif
    // r3: require BLOCK_X % TILE == 0

``tune NAME v1 v2 ...`` makes ``NAME`` a search dimension set with ``-D NAME=value``
(:attr:`~r3tui.domain.TrialConfig.tunables`); the source's own ``#define NAME value`` is the
default (the baseline sends no ``-D``), and joins the values if it is not among them.
``require EXPR`` is a :class:`~r3tui.search.expressions.Relation` over the tunables and the block
(``BLOCK_X``, ``BLOCK_Y``, ``BLOCK_Z``, ``BLOCK_THREADS``).

A kernel with an ``extern __shared__`` array says how many bytes of dynamic shared memory it
needs with ``shared EXPR``, an integer expression in the same language and names::

    // r3: tune TILE 256 512 1024 2048
    // r3: shared TILE * 4
    extern __shared__ float tile[];

Each point of the search is then launched with the bytes its tunables and block give
(:attr:`~r3tui.domain.TrialConfig.shared_mem_bytes`; a point whose size exceeds the device's
per-block limit, or is negative, is never compiled), so the staged tile size is searched like
any tunable.  At the source's defaults and the recorded block the expression must give the bytes
the recording launched with.  Without the line the recorded size is always launched.

``first NAME v1 v2 ...`` orders the values a child variant tries first for a tunable its change
added (:func:`parse_first`): ``// r3: first TILE 64 32`` where small tiles are known to pay least.

Everything here is a pure text transform: no file, no compiler.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from r3tui.analysis.text import mask
from r3tui.domain import Dim3
from r3tui.errors import ConfigError, KernelNotFound
from r3tui.search.expressions import Relation

TunableValue = int | str

_DIRECTIVE = re.compile(r"^[ \t]*//[ \t]*r3[ \t]*:[ \t]*(?P<rest>.*?)[ \t]*$", re.MULTILINE)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A value a -D may carry: an integer, an identifier or a simple numeric literal (1.5f, 0x10).
_VALUE = re.compile(r"^[-+]?[A-Za-z0-9_.]+$")
_MAX_VALUES = 64


class DeclarationError(ConfigError):
    """A ``// r3:`` line of a variant's source that does not parse."""


@dataclass(frozen=True)
class Tunable:
    """A compile-time parameter the search may set with ``-D name=value``."""

    name: str
    values: tuple[TunableValue, ...]
    default: TunableValue | None = None  # the source's own #define (None: it has none)

    def __post_init__(self) -> None:
        if not _IDENT.match(self.name) or self.name.startswith("__"):
            raise DeclarationError(f"tunable name {self.name!r} is not a C identifier")
        if not self.values:
            raise DeclarationError(f"tunable {self.name} has no values")
        if len(set(self.values)) != len(self.values):
            raise DeclarationError(f"tunable {self.name} lists a value twice")
        for value in self.values:
            if isinstance(value, str) and not _VALUE.match(value):
                raise DeclarationError(f"tunable {self.name}: bad value {value!r}")

    @property
    def numeric(self) -> bool:
        return all(isinstance(v, int) for v in self.values)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "values": list(self.values), "default": self.default}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Tunable:
        values = data.get("values")
        if not isinstance(values, list):
            raise DeclarationError(f"tunable {data.get('name')!r} needs a list of values")
        default = data.get("default")
        return cls(
            name=str(data.get("name")),
            values=tuple(_value(v) for v in values),
            default=None if default is None else _value(default),
        )


def _value(raw: object) -> TunableValue:
    if isinstance(raw, bool):
        raise DeclarationError(f"tunable value {raw!r} is not a number or identifier")
    if isinstance(raw, int):
        return raw
    text = str(raw)
    try:
        return int(text, 0) if text.lstrip("+-").isdigit() else text
    except ValueError:
        return text


def without_directives(text: str) -> str:
    """``text`` less its ``// r3:`` comment lines (each with its newline)."""
    return _DIRECTIVE_LINE.sub("", text)


_DIRECTIVE_LINE = re.compile(_DIRECTIVE.pattern + r"\n?", re.MULTILINE)


def _directives(source: str) -> list[tuple[int, str, str]]:
    """``(line number, verb, rest)`` of every ``// r3:`` comment line."""
    found = []
    for match in _DIRECTIVE.finditer(source):
        line = source.count("\n", 0, match.start()) + 1
        verb, _, rest = match.group("rest").partition(" ")
        found.append((line, verb.strip(), rest.strip()))
    return found


def _source_default(source: str, name: str) -> TunableValue | None:
    match = re.search(rf"^[ \t]*#[ \t]*define[ \t]+{re.escape(name)}[ \t]+(\S+)", source, re.M)
    return None if match is None else _value(match.group(1))


def parse_tunables(source: str) -> tuple[Tunable, ...]:
    """The ``// r3: tune`` declarations of ``source``, in order; :class:`DeclarationError`
    on a malformed or unknown ``// r3:`` line."""
    tunables: dict[str, Tunable] = {}
    written: dict[str, list[str]] = {}  # name -> its values as written
    for line, verb, rest in _directives(source):
        if verb in ("require", "shared", "exact", "first", *GRID_VERBS):
            continue
        if verb != "tune":
            raise DeclarationError(
                f"line {line}: unknown declaration '// r3: {verb}'",
                hint="known: '// r3: tune NAME v1 v2 ...', '// r3: require EXPR', "
                "'// r3: shared EXPR', '// r3: first NAME v1 v2 ...', "
                "'// r3: work_per_thread NAME [x|y|z]', "
                "'// r3: threads_per_item NAME [x|y|z]', '// r3: exact x|y|z ...'",
            )
        parts = rest.replace(",", " ").split()
        if len(parts) < 2:
            raise DeclarationError(f"line {line}: '// r3: tune' needs a name and values")
        name, raw = parts[0], parts[1:]
        if name in tunables:
            # the same line again (a model's answer that repeats a declaration of the code it
            # changes) says nothing new; other values for the name are a contradiction
            if raw == written[name]:
                continue
            raise DeclarationError(f"line {line}: tunable {name} is declared twice, with "
                                   "other values")
        written[name] = raw
        if len(raw) > _MAX_VALUES:
            raise DeclarationError(f"line {line}: tunable {name} has over {_MAX_VALUES} values")
        values = [_value(v) for v in raw]
        default = _source_default(source, name)
        if default is not None and default not in values:
            values.append(default)
        if all(isinstance(v, int) for v in values):
            values.sort(key=int)
        try:
            tunables[name] = Tunable(name, tuple(values), default)
        except DeclarationError as exc:
            raise DeclarationError(f"line {line}: {exc}") from None
    return tuple(tunables.values())


def parse_first(source: str) -> dict[str, tuple[TunableValue, ...]]:
    """The ``// r3: first NAME v1 v2 ...`` lines of ``source``: for a tunable, the values a
    child variant's first configurations try, in that order, instead of its smallest ones other
    than the default (:func:`r3tui.engine.lineage.exercising`).  A rule writes it where it knows
    from measurement where its change pays: shared-memory tiles of 4 or 8 iterations paid
    least on every kernel measured.  The default alone (``// r3: first R3_X_CONTIGUOUS 0``)
    keeps the tunable at its default in those configurations, where the rule knows its other
    values to pay least first.  :class:`DeclarationError` where the name is not a declared
    tunable, a value is not one of its values or is its default among others, or a name is
    given twice."""
    tunables = {t.name: t for t in parse_tunables(source)}
    found: dict[str, tuple[TunableValue, ...]] = {}
    for line, verb, rest in _directives(source):
        if verb != "first":
            continue
        parts = rest.replace(",", " ").split()
        if len(parts) < 2:
            raise DeclarationError(f"line {line}: '// r3: first' needs a name and values")
        name, values = parts[0], tuple(_value(v) for v in parts[1:])
        tunable = tunables.get(name)
        if tunable is None:
            raise DeclarationError(f"line {line}: '// r3: first {name}' names no tunable",
                                   hint="declare it with '// r3: tune NAME v1 v2 ...'")
        if name in found:
            raise DeclarationError(f"line {line}: '// r3: first {name}' is given twice")
        bad = [v for v in values if v not in tunable.values
               or (v == tunable.default and values != (tunable.default,))]
        if bad or len(set(values)) != len(values):
            raise DeclarationError(
                f"line {line}: '// r3: first {name}' lists {bad[0] if bad else 'a value twice'}"
                f"{'' if not bad else ', not one of its values other than the default'}")
        found[name] = values
    return found


def parse_relations(source: str) -> tuple[Relation, ...]:
    """The ``// r3: require`` relations of ``source``, parsed (never evaluated as Python)."""
    relations = []
    for line, verb, rest in _directives(source):
        if verb != "require":
            continue
        try:
            relations.append(Relation.parse(rest))
        except ConfigError as exc:
            raise DeclarationError(f"line {line}: {exc}", hint=exc.hint) from None
    return tuple(relations)


def block_env(block: Dim3) -> dict[str, int]:
    """The block's names in ``// r3: require`` and ``// r3: shared`` expressions."""
    return {"BLOCK_X": block.x, "BLOCK_Y": block.y, "BLOCK_Z": block.z,
            "BLOCK_THREADS": block.volume}


def requirements_hold(source: str, block: Dim3, values: Mapping[str, int]) -> bool:
    """Whether ``source``'s ``// r3: require`` relations hold at ``block`` and the tunables'
    ``values``; a relation that names a tunable not among them is not judged."""
    env = {**block_env(block), **values}
    return all(r.holds(env) for r in parse_relations(source) if r.names <= env.keys())


_EXTERN_SHARED = re.compile(r"\bextern\s+__shared__\b|\b__shared__\s+extern\b")


def parse_shared(source: str) -> Relation | None:
    """The ``// r3: shared EXPR`` size expression of ``source`` (None without one).

    :class:`DeclarationError` when it does not parse, is given twice, or the source declares
    no ``extern __shared__`` array (the launch's dynamic shared memory would go unused)."""
    found: Relation | None = None
    for line, verb, rest in _directives(source):
        if verb != "shared":
            continue
        if found is not None:
            raise DeclarationError(f"line {line}: '// r3: shared' is declared twice")
        try:
            found = Relation.parse(rest)
        except ConfigError as exc:
            raise DeclarationError(f"line {line}: {exc}", hint=exc.hint) from None
        if not _EXTERN_SHARED.search(mask(source, directives=True)):
            raise DeclarationError(
                f"line {line}: '// r3: shared' but the source declares no extern __shared__ "
                "array", hint="dynamic shared memory is an `extern __shared__ T name[];` array")
    return found


def shared_bytes_at(source: str, block: Dim3, values: Mapping[str, int]) -> int | None:
    """The dynamic shared memory ``source``'s ``// r3: shared`` expression gives at ``block``
    and the tunables' ``values`` (the source's defaults for those not given); None without
    the declaration (the recorded size is launched)."""
    expression = parse_shared(source)
    if expression is None:
        return None
    defaults = {t.name: t.default for t in parse_tunables(source) if isinstance(t.default, int)}
    return expression.value({**block_env(block), **defaults, **values})


AXES = ("x", "y", "z")


# the declarations that scale a launch's grid: each names a tunable and an axis
GRID_VERBS = ("work_per_thread", "threads_per_item")


@functools.lru_cache(maxsize=64)  # asked once per candidate of a variant
def parse_grid_scaling(source: str) -> dict[tuple[str, str], str]:
    """The tunables named by ``// r3: work_per_thread NAME [AXIS]`` and
    ``// r3: threads_per_item NAME [AXIS]``, (verb, axis) -> NAME (empty without any).

    ``work_per_thread``: each thread covers NAME elements along AXIS (x when not given), so a
    launch divides its grid's extent along that axis by NAME's value (the kernel strides over
    the elements, e.g. in a grid-stride loop, or holds them in registers).
    ``threads_per_item``: NAME threads share each element along AXIS (they split its loop and
    combine their parts), so a launch multiplies the grid's extent along that axis by NAME.
    NAME must be a declared tunable whose values are positive integers; an axis takes one
    such line; :class:`DeclarationError` otherwise."""
    found: dict[tuple[str, str], str] = {}
    axes: dict[str, str] = {}
    for line, verb, rest in _directives(source):
        if verb not in GRID_VERBS:
            continue
        words = rest.split()
        if len(words) not in (1, 2) or (len(words) == 2 and words[1] not in AXES):
            raise DeclarationError(
                f"line {line}: '// r3: {verb} {rest.strip()}' is not NAME [x|y|z]")
        name, axis = words[0], (words[1] if len(words) == 2 else "x")
        if found.get((verb, axis)) == name:
            continue  # the same line again
        if axis in axes:
            raise DeclarationError(
                f"line {line}: '// r3: {verb}' for axis {axis}, which "
                f"'// r3: {axes[axis]}' scales already")
        tunable = next((t for t in parse_tunables(source) if t.name == name), None)
        if tunable is None or not all(isinstance(v, int) and v >= 1 for v in tunable.values):
            raise DeclarationError(
                f"line {line}: '// r3: {verb} {name}' names no tunable of positive "
                "integers", hint="declare it with '// r3: tune NAME 1 2 4 ...'")
        found[(verb, axis)] = name
        axes[axis] = verb
    return found


def parse_exact(source: str) -> tuple[str, ...]:
    """The axes of ``// r3: exact AXIS ...`` lines: the kernel does not check its index along
    them against a bound, so a launch's grid must cover the work exactly there (its block,
    times the elements a thread covers, divides the work).  :class:`DeclarationError` on a
    word that is not an axis."""
    axes: list[str] = []
    for line, verb, rest in _directives(source):
        if verb != "exact":
            continue
        words = rest.split()
        if not words or any(w not in AXES for w in words):
            raise DeclarationError(f"line {line}: '// r3: exact {rest}' is not a list of "
                                   "axes x, y, z")
        axes.extend(w for w in words if w not in axes)
    return tuple(a for a in AXES if a in axes)


def parse_work_per_thread(source: str) -> dict[str, str]:
    """The ``work_per_thread`` lines of :func:`parse_grid_scaling`, axis -> NAME."""
    return {axis: name for (verb, axis), name in parse_grid_scaling(source).items()
            if verb == "work_per_thread"}


def grid_tunables(source: str) -> set[str]:
    """The tunables that scale the grid (either verb of :func:`parse_grid_scaling`)."""
    return set(parse_grid_scaling(source).values())


def _scales(source: str, tunables: Mapping[str, TunableValue], verb: str
            ) -> tuple[int, int, int]:
    """The factor along x, y and z that ``verb``'s lines give under ``tunables``: 1 along an
    axis without one, and everywhere where the declarations do not parse (no search could
    have scaled the grid of such a source: building its space fails first)."""
    try:
        names = parse_grid_scaling(source)
    except DeclarationError:
        return (1, 1, 1)

    def factor(axis: str) -> int:
        if (verb, axis) not in names:
            return 1
        name = names[(verb, axis)]
        value = tunables.get(name, _source_default(source, name))
        if isinstance(value, str) and value.strip().isdigit():  # as a -D value
            value = int(value)
        return value if isinstance(value, int) and value >= 1 else 1

    x, y, z = (factor(axis) for axis in AXES)
    return (x, y, z)


def work_divisors(source: str, tunables: Mapping[str, TunableValue]) -> tuple[int, int, int]:
    """The grid divisors along x, y and z a configuration's ``tunables`` give ``source``
    (its ``work_per_thread`` lines)."""
    return _scales(source, tunables, "work_per_thread")


def work_multipliers(source: str, tunables: Mapping[str, TunableValue]
                     ) -> tuple[int, int, int]:
    """The grid multipliers along x, y and z (its ``threads_per_item`` lines)."""
    return _scales(source, tunables, "threads_per_item")


def grid_scaling(source: str, tunables: Mapping[str, TunableValue]
                 ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Both: (divisors, multipliers), a replay ``Candidate``'s ``work_divisor`` and
    ``work_multiplier``."""
    return work_divisors(source, tunables), work_multipliers(source, tunables)


def work_divisor(source: str, tunables: Mapping[str, TunableValue]) -> int:
    """The elements each thread covers under ``tunables``: the product of
    :func:`work_divisors` (1 without a ``work_per_thread`` line)."""
    x, y, z = work_divisors(source, tunables)
    return x * y * z


def guard_defines(source: str, names: set[str] | frozenset[str]) -> str:
    """``source`` with every bare ``#define NAME ...`` of ``names`` wrapped in ``#ifndef NAME``
    so that ``-D NAME=value`` wins (otherwise the source's #define silently overrides it)."""
    lines = source.split("\n")
    out: list[str] = []
    for line in lines:
        match = re.match(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_][A-Za-z0-9_]*)\b", line)
        if match and match.group(1) in names:
            name = match.group(1)
            previous = next((p.strip() for p in reversed(out) if p.strip()), "")
            guarded = re.match(
                rf"^#[ \t]*(ifndef[ \t]+{name}\b|if[ \t]+!defined[ \t]*\(?[ \t]*{name}\b)",
                previous,
            )
            if not guarded:
                out.extend([f"#ifndef {name}", line, "#endif"])
                continue
        out.append(line)
    return "\n".join(out)


# ----------------------------------------------------------------------------------------
# __launch_bounds__ injection

_EXISTING_BOUNDS = re.compile(r"__launch_bounds__\s*\([^()]*\)\s*")


def inject_launch_bounds(
    source: str, kernel_name: str, max_threads: int, min_blocks: int | None = None
) -> str:
    """``source`` with ``__launch_bounds__(max_threads[, min_blocks])`` on every declaration and
    the definition of the ``__global__`` function ``kernel_name`` (an existing one is replaced).

    The attribute goes right before the kernel's name, the position the CUDA programming guide
    shows (``__global__ void __launch_bounds__(256, 2) k(...)``).  :class:`KernelNotFound` when
    no ``__global__`` function of that name is in ``source``.  The search checks that
    ``max_threads`` is at least the block volume before a point is compiled.
    """
    if isinstance(max_threads, bool) or not isinstance(max_threads, int) or max_threads < 1:
        raise ConfigError(f"launch bounds need a positive max threads, got {max_threads!r}")
    if min_blocks is not None and (
        isinstance(min_blocks, bool) or not isinstance(min_blocks, int) or min_blocks < 0
    ):
        raise ConfigError(f"launch bounds need a non-negative min blocks, got {min_blocks!r}")
    base = kernel_name.split("<", 1)[0].strip().split("::")[-1]
    if not _IDENT.match(base):
        raise KernelNotFound(f"bad kernel name {kernel_name!r}")
    bounds = f"__launch_bounds__({max_threads}" + (f", {min_blocks})" if min_blocks else ")")
    from r3tui.analysis.kernels import kernel_declarations

    edits: list[tuple[int, int, str]] = []  # (start, end, replacement)
    for found in kernel_declarations(source, base):
        head = source[found.start : found.name_at]
        for existing in _EXISTING_BOUNDS.finditer(mask(head, directives=True)):
            edits.append((found.start + existing.start(), found.start + existing.end(), ""))
        edits.append((found.name_at, found.name_at, bounds + " "))
    if not edits:
        raise KernelNotFound(f"no __global__ function {base!r} in the source")
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out
