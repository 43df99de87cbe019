"""Verification that no candidate can game: adversarial kernels caught, and what the checks cost.

Records stencil7 and reduce_sum (each with one check launch), then, in one run on one GPU:

* every adversarial kernel of :data:`CATALOG` (``tests/gpu/kernels/adversarial/``) goes the way
  a campaign's variant goes: the static check against the original first (refused ones are
  never compiled), then compile and replay with every defence on.  It counts as caught when it
  is refused, fails verification or crashes, or, for the attacks a defence neutralises rather
  than refuses (state kept in the module), when it times no faster than the honest kernel
  (``no_gain``: at least ``1 - NO_GAIN_MARGIN`` of its time).  The same kernel replayed with
  the defences off shows what passed before.
* the honest kernel and a few honest variants (options x blocks) are replayed by two workers
  on the same bundle, one with the defences on and one with them off, alternating which goes
  first; the replay wall time per candidate gives ``verification_overhead_pct`` with a 95 %
  bootstrap interval over candidates, and the kernel medians show the timing is unchanged.

    python bench/verification.py [--scale 1.0] [--out results.txt]
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

from r3tui.domain import Dim3, Measurement  # noqa: E402

ADVERSARIAL = ROOT / "tests" / "gpu" / "kernels" / "adversarial"
NO_GAIN_MARGIN = 0.10


@dataclass(frozen=True)
class Attack:
    """One adversarial kernel and the outcome that counts as caught."""

    file: str
    example: str  # the recording it replays against
    kind: str  # the class in docs/verification.md
    expect: str  # unsafe | wrong_result | crashed | no_gain, or alternatives joined by |
    mentions: str = ""  # a word the refusal or the verification message must contain


CATALOG: tuple[Attack, ...] = (
    Attack("skip_after_first.cu", "stencil7", "skips work after the first launch", "no_gain"),
    Attack("every_other.cu", "stencil7", "computes on every other launch", "no_gain"),
    Attack("static_counter.cu", "stencil7", "skips work via a function-scope static",
           "no_gain"),
    Attack("heap_cache.cu", "stencil7", "caches its output on the device heap", "unsafe",
           "malloc"),
    Attack("partial_write.cu", "stencil7", "writes only part of the output", "wrong_result",
           "out:"),
    Attack("lower_precision.cu", "stencil7", "lower precision than declared", "wrong_result",
           "out:"),
    Attack("writes_input.cu", "stencil7", "writes a buffer it should only read",
           "wrong_result", "in:"),
    Attack("racing.cu", "stencil7", "racing result", "wrong_result", "out:"),
    Attack("clock_gated.cu", "stencil7", "timing-dependent result", "unsafe", "globaltimer"),
    Attack("reads_beyond.cu", "stencil7", "reads the recorder's memory", "crashed",
           "ILLEGAL_ADDRESS"),
    # on the smaller check launch its compiled-in strides index past the buffers: a wrong
    # result or an illegal address, depending on what lies there
    Attack("hardcoded_size.cu", "stencil7", "fits the recorded sizes", "wrong_result|crashed",
           "check"),
    Attack("hardcoded_sum.cu", "reduce_sum", "fits the recorded data", "wrong_result",
           "check launch"),
)

HONEST_OPTIONS: tuple[tuple[str, ...], ...] = (
    (), ("--maxrregcount=64",), ("--maxrregcount=32",), ("--ptxas-options=-O2",),
    ("--use_fast_math",))
HONEST_BLOCKS = {"stencil7": (None, Dim3(32, 4, 2), Dim3(64, 4, 1)),
                 "reduce_sum": (None, Dim3(256), Dim3(512))}


def adversarial_source(attack: Attack, bundle: Any) -> str:
    """The attack's source with the recording's values filled in where it hard-codes them."""
    import numpy as np

    text = (ADVERSARIAL / attack.file).read_text()
    m = bundle.manifest
    if "RECORDED_EDGE" in text:
        nx = next(p.value for p in m.params if p.name == "nx")
        text = text.replace("RECORDED_EDGE", str(nx))
    if "RECORDED_SUM_BITS" in text:
        out = m.allocation("out")
        bits = int(np.frombuffer(bundle.blob(out.epilogue), dtype=np.int64)[0])
        text = text.replace("RECORDED_SUM_BITS", f"{bits}ll")
    return text


def compile_candidate(source: str, kernel: str, arch: str, options: tuple[str, ...] = (),
                      block: Dim3 | None = None, label: str | None = None) -> Any:
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.replay import Candidate

    compiled = get_toolchain("nvrtc").compile(CompileRequest(
        source=source, kernel_name=kernel, arch=arch, options=options,
        source_name=label or f"{kernel}.cu"))
    if not compiled.ok:
        raise RuntimeError(f"{label}: does not compile: {compiled.log[:400]}")
    return Candidate.from_compiled(compiled, block=block, label=label)


@dataclass
class Outcome:
    attack: Attack
    status: str  # unsafe | a MeasurementStatus value
    reason: str
    speedup: float | None  # over the honest kernel, where it ran and verified
    before: str  # what the defences-off replay said

    @property
    def caught(self) -> bool:
        if self.attack.expect == "no_gain":
            return self.status != "ok" or (self.speedup is not None
                                           and self.speedup <= 1 + NO_GAIN_MARGIN)
        return (self.status in self.attack.expect.split("|")
                and self.attack.mentions in self.reason)


def run_attack(attack: Attack, bundle: Any, arch: str, honest_s: float,
               evaluate: Callable[[Any], Measurement],
               evaluate_off: Callable[[Any], Measurement]) -> Outcome:
    """Static check, then replay with the defences on; the defences-off replay for contrast."""
    from r3tui.analysis import check_candidate

    source = adversarial_source(attack, bundle)
    original = bundle.source()
    candidate = compile_candidate(source, bundle.manifest.kernel.name, arch,
                                  label=attack.file)
    before = evaluate_off(candidate)
    before_text = before.status.value + (
        f", {honest_s / before.time.median_s:.2f}x" if before.ok and before.time else "")
    report = check_candidate(original, source)
    if report.refused:
        return Outcome(attack, "unsafe", report.reason or "", None, before_text)
    m = evaluate(candidate)
    speedup = honest_s / m.time.median_s if m.ok and m.time else None
    return Outcome(attack, m.status.value, m.error_text or "", speedup, before_text)


def bootstrap_ratio(on: list[float], off: list[float], rounds: int = 2000,
                    seed: int = 0) -> tuple[float, float, float]:
    """sum(on)/sum(off) over paired candidates, and its 95 % bootstrap interval."""
    rng = random.Random(seed)
    pairs = list(zip(on, off, strict=True))
    point = sum(on) / sum(off)
    draws = []
    for _ in range(rounds):
        sample = [rng.choice(pairs) for _ in pairs]
        draws.append(sum(a for a, _ in sample) / sum(b for _, b in sample))
    draws.sort()
    return point, draws[int(0.025 * rounds)], draws[int(0.975 * rounds) - 1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0,
                        help="problem scale of both recordings (default 1.0: full size)")
    parser.add_argument("--work", type=Path, default=None, help="where bundles go")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)

    from catalog import load_example  # type: ignore[import-not-found]

    from r3tui.record.bundle import Bundle
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel
    from r3tui.replay import ReplayWorker
    from r3tui.replay.verify import CheckPolicy

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    work = args.work or Path(tempfile.mkdtemp(prefix="r3-verification-"))
    say(f"# bench/verification.py, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, host "
        f"{platform.node()}, scale {args.scale}")
    outcomes: list[Outcome] = []
    overhead_on: list[float] = []
    overhead_off: list[float] = []
    defence_s: list[float] = []  # per candidate, measured inside the worker
    timing_rows: list[tuple[str, float, float]] = []
    for name in ("stencil7", "reduce_sum"):
        example = load_example(name)
        path = work / f"{name}.r3b"
        if not path.exists():
            record_kernel(RecordKernelRequest(
                Path(example.path) / "kernel.cu", example.kernel_name,
                Path(example.path) / "inputs.py", path, seed=0, scale=args.scale))
        bundle = Bundle.open(path)
        kernel = bundle.manifest.kernel.name
        with ReplayWorker(path, timeout_s=60) as on, \
                ReplayWorker(path, timeout_s=60, checks=CheckPolicy.off()) as off:
            info = on.start()
            off.start()
            say(f"## {name}: {info.gpu}, {bundle.manifest.working_set_bytes / 1e6:.0f} MB, "
                f"check launches: {', '.join(c.label for c in bundle.manifest.checks)}")
            source = bundle.source() or ""
            honest = compile_candidate(source, kernel, info.arch, label="honest")
            first = on.evaluate(honest)
            if not first.ok or first.time is None:
                raise RuntimeError(f"{name}: the honest kernel failed: {first.error_text}")
            honest_s = first.time.median_s
            # honest variants: each evaluated by both workers, alternating which goes first
            k = 0
            seen: set[tuple[str, Dim3 | None]] = {(honest.binary_sha256, None)}
            defence_before = on.stats()["defence_s"]
            for options in HONEST_OPTIONS:
                for block in HONEST_BLOCKS[name]:
                    if not options and block is None:
                        continue  # the honest kernel itself: measured once, above
                    c = compile_candidate(source, kernel, info.arch, options, block,
                                          label=f"honest {options} {block}")
                    if (c.binary_sha256, block) in seen:
                        continue  # the same code (fast math on double code): measured once
                    seen.add((c.binary_sha256, block))
                    c = replace(c, label=f"{c.label} #{k}")
                    pair = [(on, overhead_on), (off, overhead_off)]
                    results: dict[int, Measurement] = {}
                    for w, sink in (pair if k % 2 == 0 else pair[::-1]):
                        m = w.evaluate(c)
                        if not m.ok or m.replay_wall_s is None or m.time is None:
                            raise RuntimeError(f"{c.label}: {m.status}: {m.error_text}")
                        sink.append(m.replay_wall_s)
                        results[id(w)] = m
                        if w is on:
                            defence_after = on.stats()["defence_s"]
                            defence_s.append(defence_after - defence_before)
                            defence_before = defence_after
                    t_on = results[id(on)].time
                    t_off = results[id(off)].time
                    assert t_on is not None and t_off is not None
                    shape = "x".join(map(str, block.as_tuple())) if block else "recorded"
                    timing_rows.append((f"{name} {' '.join(options) or 'no options'} {shape}",
                                        t_on.median_s, t_off.median_s))
                    k += 1
            for attack in (a for a in CATALOG if a.example == name):
                outcomes.append(run_attack(attack, bundle, info.arch, honest_s, on.evaluate,
                                           off.evaluate))

    say("")
    say(f"{'attack':22} {'class':42} {'expected':13} {'got':13} {'x honest':>8}  caught  "
        "defences off")
    for o in outcomes:
        x = f"{o.speedup:.2f}" if o.speedup is not None else "-"
        say(f"{o.attack.file:22} {o.attack.kind[:42]:42} {o.attack.expect:13} {o.status:13} "
            f"{x:>8}  {'yes' if o.caught else 'NO':6}  {o.before}")
        say(f"    {o.reason[:150]}")
    say("")
    say(f"{'honest candidate':52} {'µs on':>9} {'µs off':>9} {'on/off':>7}")
    for label, a, b in timing_rows:
        say(f"{label[:52]:52} {a * 1e6:9.2f} {b * 1e6:9.2f} {a / b:7.3f}")
    say(f"replay wall per candidate: on {statistics.mean(overhead_on) * 1e3:.2f} ms, off "
        f"{statistics.mean(overhead_off) * 1e3:.2f} ms over {len(overhead_on)} candidates")
    ratio, lo, hi = bootstrap_ratio(overhead_on, overhead_off)
    share, share_lo, share_hi = bootstrap_ratio(defence_s, overhead_on)
    say(f"time in the defences, measured in the worker: {statistics.mean(defence_s) * 1e3:.2f} "
        f"ms per candidate, {100 * share:.1f} % of the replay wall time with them "
        f"[{100 * share_lo:.1f}, {100 * share_hi:.1f}]")
    medians = [a / b for _, a, b in timing_rows]
    say("")
    say(f"adversarial_caught: {sum(o.caught for o in outcomes)}/{len(outcomes)}")
    say(f"verification_overhead_pct: {100 * (ratio - 1):.1f} "
        f"[{100 * (lo - 1):.1f}, {100 * (hi - 1):.1f}] (wall on over off, two workers)")
    say(f"verification_share_of_replay_wall_pct: {100 * share:.1f} "
        f"[{100 * share_lo:.1f}, {100 * share_hi:.1f}] (timed inside the worker)")
    say(f"honest_kernel_time_on_over_off: {statistics.median(medians):.3f} "
        f"(range {min(medians):.3f}-{max(medians):.3f})")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0 if all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
