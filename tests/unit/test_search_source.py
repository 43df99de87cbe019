"""What a variant's source declares (tunables, relations) and the launch-bounds edit."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.compile.base import CompileRequest, get_toolchain
from r3tui.domain import Dim3
from r3tui.errors import ConfigError, KernelNotFound
from r3tui.search.expressions import ExpressionError, Relation
from r3tui.search.source import (
    DeclarationError,
    Tunable,
    guard_defines,
    inject_launch_bounds,
    parse_first,
    parse_relations,
    parse_tunables,
)
from r3tui.search.space import LaunchSpec, SearchSpace, SpaceError, defines_for

EXAMPLES = sorted(Path(__file__).resolve().parents[2].glob("examples/*/kernel.cu"))

TILED = """\
// r3: tune TILE 8 16 32
#ifndef TILE
#define TILE 16
#endif
// r3: tune VEC 1, 2, 4
//r3: tune MODE fast exact
// r3: require TILE * VEC <= 64
// r3: require BLOCK_X % TILE == 0 && BLOCK_THREADS >= 2 * TILE
extern "C" __global__ void tiled(float* x) { x[threadIdx.x] = TILE * VEC; }
"""


def test_tunables_are_parsed_with_their_source_defaults() -> None:
    tunables = parse_tunables(TILED)
    assert tunables == (
        Tunable("TILE", (8, 16, 32), 16),
        Tunable("VEC", (1, 2, 4), None),
        Tunable("MODE", ("fast", "exact"), None),
    )
    # a #define outside the declared values joins them, so the baseline stays a point
    assert parse_tunables("// r3: tune B 32 8\n#define B 12\n") == (
        Tunable("B", (8, 12, 32), 12),)


@pytest.mark.parametrize(
    "source",
    [
        "// r3: tune TILE\n",
        "// r3: tune 9X 1 2\n",
        "// r3: tune T 1 1\n",
        "// r3: tune T 1 2\n// r3: tune T 3 4\n",
        "// r3: tune T 1 $(rm)\n",
        "// r3: tunable T 1 2\n",
    ],
)
def test_bad_declarations_are_one_line_errors(source: str) -> None:
    with pytest.raises(DeclarationError, match="line"):
        parse_tunables(source)


def test_a_declaration_repeated_word_for_word_is_one_declaration() -> None:
    # a model's repair repeats the declarations of the change it fixes (Qwen on the demo's
    # nbody: "tunable WPT is declared twice" in three of eight repairs); the same line twice
    # says nothing new, other values for the name still contradict
    from r3tui.search.source import parse_grid_scaling

    twice = ("// r3: tune WPT 1 2 4 8\n// r3: work_per_thread WPT\n"
             "// r3: tune WPT 1 2 4 8\n// r3: work_per_thread WPT\n")
    (wpt,) = parse_tunables(twice)
    assert wpt.name == "WPT" and wpt.values == (1, 2, 4, 8)
    assert parse_grid_scaling(twice) == {("work_per_thread", "x"): "WPT"}
    with pytest.raises(DeclarationError, match="declared twice, with other values"):
        parse_tunables("// r3: tune WPT 1 2 4 8\n// r3: tune WPT 1 2\n")
    with pytest.raises(DeclarationError, match="scales already"):
        parse_grid_scaling("// r3: tune A 1 2\n// r3: tune B 1 2\n"
                           "// r3: work_per_thread A\n// r3: work_per_thread B\n")


def test_first_values_order_what_a_child_tries_and_are_checked_against_the_tunable() -> None:
    first = TILED + "// r3: first TILE 32 8\n// r3: first MODE exact\n"
    assert parse_tunables(first) == parse_tunables(TILED)  # the verb is known, declares nothing
    assert parse_first(first) == {"TILE": (32, 8), "MODE": ("exact",)}
    assert parse_first(TILED) == {}
    # the default alone: kept at the default in a child's first configurations
    assert parse_first(TILED + "// r3: first TILE 16\n") == {"TILE": (16,)}
    for bad, why in (("// r3: first SIZE 8", "names no tunable"),
                     ("// r3: first TILE 64", "lists 64, not one of its values"),
                     ("// r3: first TILE 16 8", "lists 16, not one of its values other than"),
                     ("// r3: first TILE 8 8", "lists a value twice"),
                     ("// r3: first TILE", "needs a name and values"),
                     ("// r3: first TILE 8\n// r3: first TILE 32", "given twice")):
        with pytest.raises(DeclarationError, match=why):
            parse_first(TILED + bad + "\n")


@pytest.mark.parametrize(
    ("text", "env", "expected"),
    [
        ("TILE * VEC <= 64", {"TILE": 16, "VEC": 4}, True),
        ("TILE * VEC <= 64", {"TILE": 32, "VEC": 4}, False),
        ("BLOCK_X % TILE == 0", {"BLOCK_X": 64, "TILE": 16}, True),
        ("BLOCK_X % TILE == 0", {"BLOCK_X": 8, "TILE": 16}, False),
        ("BLOCK_X % TILE == 0", {"BLOCK_X": 8, "TILE": 0}, False),  # x % 0: invalid, no error
        ("-7 / 2 == -3 and -7 % 2 == -1", {}, True),  # C truncation, not Python flooring
        ("1 < A < 4", {"A": 3}, True),
        ("1 < A < 4", {"A": 4}, False),
        ("not (A == 1) || B != 2", {"A": 1, "B": 2}, False),
        ("!(A == 1) or (A + B) * 2 > 5", {"A": 1, "B": 2}, True),
        ("A >= 2 and B >= 2 or A == 0", {"A": 0, "B": 0}, True),
        ("2 + 3 * 4 == 14", {}, True),
    ],
)
def test_relations_evaluate_like_c(text: str, env: dict[str, int], expected: bool) -> None:
    assert Relation.parse(text).holds(env) is expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('echo pwned')",
        "__import__",
        "os.system('x')",
        "TILE ** 99999",
        "().__class__",
        "lambda: 1",
        "f(TILE)",
        "TILE if 1 else 2",
        "'a' == 'a'",
        "[1][0]",
        "TILE; import os",
        "TILE = 4",
        "1 +",
        "(" * 60 + "1" + ")" * 60,
        "1" * 20,
        "A + " * 200 + "1",
        "",
    ],
)
def test_relations_reject_anything_but_the_tiny_language(text: str) -> None:
    with pytest.raises(ExpressionError):
        Relation.parse(text)


def test_relations_from_source_and_unknown_names() -> None:
    relations = parse_relations(TILED)
    assert [r.text for r in relations] == [
        "TILE * VEC <= 64", "BLOCK_X % TILE == 0 && BLOCK_THREADS >= 2 * TILE"]
    with pytest.raises(DeclarationError, match="line 2"):
        parse_relations("// r3: tune T 1 2\n// r3: require __import__('os')\n")
    launch = LaunchSpec(Dim3(64), Dim3(1 << 16), True)
    with pytest.raises(SpaceError, match="names NOPE"):
        SearchSpace.from_parts([], launch, parse_tunables(TILED), ["NOPE > 1"])
    with pytest.raises(SpaceError, match="MODE"):  # strings are not numbers
        SearchSpace.from_parts([], launch, parse_tunables(TILED), ["MODE > 1"])


def test_relations_shape_the_space() -> None:
    space = SearchSpace.from_parts([], LaunchSpec(Dim3(64), Dim3(1 << 16), True),
                                   parse_tunables(TILED), parse_relations(TILED))
    configs = list(space.enumerate())
    assert configs
    for config in configs:
        tile = int(config.tunables.get("TILE", 16))
        vec = int(config.tunables["VEC"])
        block = config.block or Dim3(64)
        assert tile * vec <= 64 and block.x % tile == 0 and block.volume >= 2 * tile
        assert config.tunables["MODE"] in ("fast", "exact")
        assert dict(defines_for(config))["VEC"] == str(vec)
    for point in space.sample(random.Random(1), 50):
        assert space.is_valid_point(point)


def test_guard_defines_lets_a_define_win() -> None:
    source = "#define TILE 16\n#ifndef VEC\n#define VEC 2\n#endif\n#define OTHER 1\n"
    out = guard_defines(source, {"TILE", "VEC"})
    assert out == ("#ifndef TILE\n#define TILE 16\n#endif\n#ifndef VEC\n#define VEC 2\n#endif\n"
                   "#define OTHER 1\n")
    assert guard_defines(out, {"TILE", "VEC"}) == out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.parent.name)
def test_injected_launch_bounds_compile_with_nvrtc(path: Path) -> None:
    name = path.parent.name
    source = inject_launch_bounds(path.read_text(), name, 256, 2)
    assert source.count("__launch_bounds__(256, 2)") == 1
    compiled = get_toolchain("nvrtc").compile(CompileRequest(source, name))
    assert compiled.ok, compiled.log
    assert compiled.resources.max_threads_per_block == 256  # the bound reached the cubin
    again = inject_launch_bounds(source, name, 128)  # replaces, does not stack
    assert again.count("__launch_bounds__") == 1 and "__launch_bounds__(128)" in again


def test_launch_bounds_touch_only_the_named_kernel() -> None:
    source = (
        '// tiled(x) is called below; "tiled(" in a string too\n'
        "__device__ float helper(float v) { return v; }\n"
        'extern "C" __global__ void tiled(float* x);\n'
        "__global__ void other(float* x) { x[0] = helper(1.0f); }\n"
        'extern "C" __global__ void tiled(float* x)\n{\n    x[0] = 1.0f;\n}\n'
        'const char* s = "tiled(";\n'
    )
    out = inject_launch_bounds(source, "tiled", 512, None)
    assert out.count("__launch_bounds__(512) tiled(") == 2  # declaration and definition
    assert "void other(" in out and "// tiled(x) is called" in out and '"tiled("' in out
    with pytest.raises(KernelNotFound):
        inject_launch_bounds(source, "helper", 128, 1)
    with pytest.raises(KernelNotFound):
        inject_launch_bounds(source, "missing", 128, 1)
    with pytest.raises(ConfigError):
        inject_launch_bounds(source, "tiled", 0, 1)
