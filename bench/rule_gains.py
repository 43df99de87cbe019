"""What each rule operator gains on each example, on the GPU, by itself.

For every example (recorded fresh at ``--scale``), every rule that applies (each loop for
``vector_access``, one after another, since it rewrites one loop a call) is compiled with
NVRTC at each value of the tunable it declares, replayed against the recording (verified),
and the verified variants are re-timed against the original in interleaved rounds at the
recorded block.  A rule whose variant pays only with a smaller grid
(``// r3: work_per_thread``) is launched with that grid.  Prints one line per variant and
``rule_gain_<example>_<rule>: <ratio> [<low>, <high>]`` for the best value of each rule (the
ratio original/variant, the order-statistic interval of the rounds' ratios; "within noise"
where the interval includes 1).  This is the gain of the transformation alone, before any search
of options or block shape.

    python bench/rule_gains.py [--examples reduce_sum,softmax] [--scale 1.0] [--rounds 15]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXAMPLES = ("reduce_sum", "softmax", "sgemm", "stencil7", "spmv_csr", "nbody")


def variants(source: str, example: str, rules: tuple[str, ...] | None = None,
             only: Mapping[str, tuple[int, ...]] | None = None
             ) -> list[tuple[str, str, tuple[tuple[str, str], ...]]]:
    """``(label, source, defines)`` of every rule variant, at each declared tunable value
    (``only``: a tunable's values kept, where it names it)."""
    from r3tui.remix.rules import RULES, apply_rule
    from r3tui.search.source import parse_tunables

    def kept(name: str, value: object) -> bool:
        """Whether ``only`` keeps the tunable's ``value`` (every value where it names none)."""
        return only is None or name not in only or value in only[name]

    made: list[tuple[str, str]] = []
    for rule in sorted(rules or RULES):
        result = apply_rule(rule, source, example, random.Random(0))
        if not result.ok or result.source is None:
            continue
        made.append((rule, result.source))
        if rule == "coarsen":  # each choice of axes the rule makes (one axis or two)
            seen = {result.source}
            for seed in range(1, 40):
                other = apply_rule(rule, source, example, random.Random(seed))
                if other.ok and other.source is not None and other.source not in seen:
                    seen.add(other.source)
                    made.append((rule, other.source))
        if rule == "vector_access":  # every loop, one more each time
            text, step = result.source, 1
            while True:
                again = apply_rule(rule, text, example, random.Random(step))
                if not again.ok or again.source is None:
                    break
                text, step = again.source, step + 1
                made.append((f"{rule} x{step}", text))
    # the reduction's two rules together: the sum a thread takes first, then warp shuffles
    by_rule = dict(made)
    if "strided_accumulate" in by_rule:
        both = apply_rule("warp_shuffle_reduction", by_rule["strided_accumulate"], example,
                          random.Random(0))
        if both.ok and both.source is not None:
            made.append(("strided_accumulate+warp_shuffle_reduction", both.source))
    # register blocking with shared-memory tiles: each coarsening of the example, tiled
    for text in [t for rule, t in made if rule == "coarsen"]:
        both = apply_rule("tile_shared", text, example, random.Random(0))
        if both.ok and both.source is not None:
            made.append(("coarsen+tile_shared", both.source))
    out: list[tuple[str, str, tuple[tuple[str, str], ...]]] = []
    for label, text in made:
        tunables = [t for t in parse_tunables(text) if t.name.startswith("R3_")]
        if not tunables:
            out.append((label, text, ()))
        if label.startswith(("coarsen", "strided_accumulate")):  # every combination of the
            # axes' factors (with tiles: of 8 to 64 iterations; 0 is the coarsening alone), or
            # of the elements a thread sums and the vector width it loads them at
            choices = [[v for v in t.values if (t.name != "R3_TILE" or v in (8, 16, 32, 64))
                        and kept(t.name, v)] for t in tunables]
            for values in itertools.product(*choices):
                defines = tuple((t.name, str(v)) for t, v in zip(tunables, values, strict=True))
                out.append((f"{label} " + ",".join(f"{n}={v}" for n, v in defines), text,
                            defines))
            continue
        for t in tunables:
            out += [(f"{label} {t.name}={v}", text, ((t.name, str(v)),)) for v in t.values
                    if kept(t.name, v)]
    return out


class _Emitting(list[str]):
    """A list of lines that passes each one on as it is added."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        super().__init__()
        self.emit = emit

    def append(self, line: str) -> None:
        super().append(line)
        self.emit(line)


def parse_values(text: str) -> dict[str, tuple[int, ...]]:
    """``R3_TILE=32,64;R3_CF_X=4`` as the values each named tunable keeps."""
    out: dict[str, tuple[int, ...]] = {}
    for item in (t.strip() for t in text.split(";") if t.strip()):
        name, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",")]
        if not sep or not name.strip() or not all(v.lstrip("-").isdigit() for v in parts):
            raise ValueError(f"not NAME=V1,V2: {item!r} (e.g. R3_TILE=32,64)")
        out[name.strip()] = tuple(int(v) for v in parts)
    return out


def parse_blocks(text: str) -> list[tuple[int, int, int]]:
    """``32x8,16x16x1`` as block shapes (a missing axis is 1)."""
    shapes = []
    for item in (t for t in text.split(",") if t):
        parts = item.lower().split("x")
        if not 1 <= len(parts) <= 3 or not all(v.isdigit() and int(v) > 0 for v in parts):
            raise ValueError(f"not a block shape: {item!r} (e.g. 32x8)")
        x, y, z = [*(int(v) for v in parts), 1, 1][:3]
        shapes.append((x, y, z))
    return shapes


def set_carveout(bundle_path: Path, percent: int) -> None:
    """Have every replay of the bundle run with ``percent`` of the L1/shared-memory store as
    shared memory (``CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT``, as a recorded
    application's split is replayed): whether a tiled variant's block shape matters through
    the split the driver picks for it.  The original runs with the same split."""
    import json

    from r3tui.record.bundle import MANIFEST_NAME

    manifest = bundle_path / MANIFEST_NAME
    data = json.loads(manifest.read_text())
    data["launch"]["carveout"] = percent
    manifest.write_text(json.dumps(data, indent=2))


def run_example(example: str, scale: float, rounds: int, work: Path,
                rules: tuple[str, ...] | None = None,
                emit: Callable[[str], None] = print,
                blocks: list[tuple[int, int, int]] | None = None,
                carveout: int | None = None,
                only: Mapping[str, tuple[int, ...]] | None = None) -> list[str]:
    """Each variant's line, given to ``emit`` as it is measured (a run cut short by a time
    limit keeps what it printed), then the best of each rule; all of them returned.
    ``blocks``: shapes each variant is measured at besides the recorded block (labelled
    ``@XxYxZ``): where the rules' gains depend on the block the search would pick."""
    from r3tui.compile.base import CompiledKernel, CompileRequest, get_toolchain
    from r3tui.domain import Dim3, TrialConfig
    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.replay.candidate import Candidate
    from r3tui.replay.worker import ReplayWorker
    from r3tui.search.source import grid_scaling, requirements_hold, shared_bytes_at
    from r3tui.search.winner import summarize

    ex = ROOT / "examples" / example
    source = (ex / "kernel.cu").read_text()
    bundle_path = work / f"{example}.r3b"
    record_kernel(RecordKernelRequest(ex / "kernel.cu", example, ex / "inputs.py", bundle_path,
                                      seed=2, scale=scale))
    if carveout is not None:
        set_carveout(bundle_path, carveout)
    block = Bundle.open(bundle_path).manifest.launch.block
    nvrtc = get_toolchain("nvrtc")
    lines = _Emitting(emit)
    best: dict[str, tuple[float, float, float, str]] = {}
    with ReplayWorker(bundle_path, timeout_s=60) as worker:
        info = worker.start()
        original = Candidate.from_compiled(
            nvrtc.compile(CompileRequest(source, example, arch=info.arch)), block=block)
        if not worker.evaluate(original, timed=False).ok:
            lines.append(f"{example:10} the original does not replay")
            return lines
        def measure_at(shape: Dim3, label: str, text: str, defines: tuple[tuple[str, str], ...],
                       values: dict[str, int], compiled: CompiledKernel) -> str | None:
            """The variant's line at ``shape`` (None: not launchable there); its best kept."""
            # the variant's `// r3: require` relations at the block (a split's threads of an
            # element must divide its x extent)
            if not requirements_hold(text, shape, values):
                return None if shape != block else (
                    f"{example:10} {label:40} not at the recorded block {block}")
            divisor, multiplier = grid_scaling(text, dict(defines))
            # a tiled variant launches with the dynamic shared memory it declares
            shared = shared_bytes_at(text, shape, values)
            candidate = Candidate.from_compiled(compiled, block=shape, work_divisor=divisor,
                                                work_multiplier=multiplier,
                                                shared_mem_bytes=shared)
            measured = worker.evaluate(candidate, timed=False)
            if not measured.ok:
                return (f"{example:10} {label:40} {measured.status.value}: "
                        f"{(measured.error_text or '')[:60]}")
            base, mine = worker.interleaved([original, candidate], rounds)
            f = summarize(TrialConfig(), base, mine)
            rule = label.split(" ")[0]
            if rule not in best or f.speedup > best[rule][0]:
                best[rule] = (f.speedup, f.low, f.high, label)
            return (f"{example:10} {label:40} {f.speedup:6.3f}x [{f.low:.3f}, {f.high:.3f}]"
                    f"  {f.median_s * 1e6:9.2f} us")

        shapes = [block] + [Dim3(*b) for b in blocks or () if Dim3(*b) != block]
        for label0, text, defines in variants(source, example, rules, only):
            values = {k: int(v) for k, v in defines if v.lstrip("-").isdigit()}
            compiled = nvrtc.compile(CompileRequest(text, example, arch=info.arch,
                                                    defines=defines))
            if not compiled.ok:
                lines.append(f"{example:10} {label0:40} does not compile")
                continue
            for shape in shapes:
                label = label0 if shape == block else f"{label0} @{shape.x}x{shape.y}x{shape.z}"
                line = measure_at(shape, label, text, defines, values, compiled)
                if line is not None:
                    lines.append(line)
    for rule, (speedup, low, high, label) in sorted(best.items()):
        noise = " within noise" if low <= 1.0 <= high else ""
        lines.append(f"rule_gain_{example}_{rule}: {speedup:.3f} [{low:.3f}, {high:.3f}]{noise}"
                     f"  ({label})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--examples", default=",".join(EXAMPLES))
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--rules", default="", help="comma-separated rule names (all)")
    parser.add_argument("--blocks", default="",
                        help="block shapes to measure each variant at besides the recorded "
                             "one, e.g. 32x8,16x16,64x4")
    parser.add_argument("--values", default="",
                        help="the values a tunable keeps, e.g. 'R3_TILE=32,64;R3_STAGES=2' "
                             "(all where not named)")
    parser.add_argument("--carveout", type=int, default=None,
                        help="percent of the L1/shared store as shared memory in every replay "
                             "(0-100; the driver's choice where not given)")
    args = parser.parse_args(argv)
    try:
        blocks = parse_blocks(args.blocks)
        only = parse_values(args.values)
        if args.carveout is not None and not 0 <= args.carveout <= 100:
            raise ValueError(f"--carveout {args.carveout} is not a percent (0-100)")
    except ValueError as exc:
        print(f"rule_gains.py: error: {exc}", file=sys.stderr)
        return 2
    rules = tuple(r for r in args.rules.split(",") if r) or None
    print(f"# bench/rule_gains.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, scale {args.scale}, "
          f"{args.rounds} interleaved rounds"
          + (f", carveout {args.carveout}%" if args.carveout is not None else ""))
    with tempfile.TemporaryDirectory() as tmp:
        for example in args.examples.split(","):
            run_example(example, args.scale, args.rounds, Path(tmp), rules,
                        lambda line: print(line, flush=True), blocks, args.carveout, only)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
