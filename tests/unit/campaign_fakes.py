"""A named fake of the GPU side of a campaign, for CPU tests of the outer loop.

``CompiledCostEvaluator`` compiles every configuration for real with NVRTC (sm_90, in
process) and, where the GPU replay would run, returns a time from a made-up but deterministic
cost model of the cubin (registers, block shape, the source's text).  It cannot verify
results, so every variant that compiles counts as correct.  The real evaluator
(``r3tui.engine.ReplayEvaluator``) runs in tests/gpu on the device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from r3tui.compile.base import get_toolchain
from r3tui.domain import Measurement, MeasurementStatus, TimeStats, TrialConfig
from r3tui.engine import KernelSource, compile_failure, compile_request


def source_factor(text: str) -> float:
    """A stable per-source factor in [0.7, 1.1): some rewrites are faster, some slower."""
    h = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big")
    return 0.7 + 0.4 * (h / 2**32)


def modelled_time(text: str, config: TrialConfig, registers: int | None) -> float:
    block = config.block.volume if config.block else 256
    t = 100e-6 * source_factor(text) * (1 + abs(block - 256) / 512)
    t *= 1 + max(0, (registers or 32) - 32) / 256
    if "--use_fast_math" in config.options:
        t *= 0.97
    return t


class CompiledCostEvaluator:
    """FAKE replay: real NVRTC compiles, modelled times, no verification (no GPU here)."""

    def __init__(self, source: KernelSource) -> None:
        self.source = source
        self.toolchain = get_toolchain("nvrtc")
        self.compiles = 0

    def evaluate(self, configs: Sequence[TrialConfig]) -> list[Measurement]:
        out = []
        for config in configs:
            compiled = self.toolchain.compile(compile_request(self.source, config, "sm_90"))
            self.compiles += 1
            if not compiled.ok:
                out.append(compile_failure(compiled))
                continue
            t = self.time_of(config, compiled.resources.registers)
            out.append(
                Measurement(
                    MeasurementStatus.OK,
                    time=TimeStats(t, t, 0.0, 10),
                    verified=True,
                    resources=compiled.resources,
                    compile_time_s=compiled.seconds,
                    replay_wall_s=0.001,
                    binary_sha256=compiled.binary_sha256,
                )
            )
        return out

    def time_of(self, config: TrialConfig, registers: int | None) -> float:
        return modelled_time(self.source.text, config, registers)

    def code_hash(self, config: TrialConfig) -> str | None:
        """Real: the compiler's code hash, as ReplayEvaluator.code_hash gives it."""
        compiled = self.toolchain.compile(compile_request(self.source, config, "sm_90"))
        self.compiles += 1
        return compiled.binary_sha256 if compiled.ok else None

    def retime(self, configs: Sequence[TrialConfig], rounds: int) -> list[list[float]]:
        measured = self.evaluate(configs)
        times = [m.time.median_s if m.time else 1.0 for m in measured]
        # deterministic "noise" so the winner's interval is not degenerate
        return [
            [t * (1 + 0.002 * ((r * 7 + i) % 5)) for i, t in enumerate(times)]
            for r in range(rounds)
        ]

    def interleave_many(self, other: CompiledCostEvaluator, mine: TrialConfig,
                        theirs: Sequence[TrialConfig], rounds: int
                        ) -> tuple[list[float], list[list[float]]]:
        """FAKE interleaved re-timing: ``mine`` of this source, ``theirs`` of ``other``'s,
        modelled times with the same deterministic noise as :meth:`retime`."""
        (base,) = self.evaluate([mine])
        times = [base, *other.evaluate(theirs)]
        medians = [m.time.median_s if m.time else 1.0 for m in times]
        per_job = [[t * (1 + 0.002 * ((r * 7 + i) % 5)) for r in range(rounds)]
                   for i, t in enumerate(medians)]
        return per_job[0], per_job[1:]

    def interleave_with(self, other: CompiledCostEvaluator, mine: TrialConfig,
                        theirs: TrialConfig, rounds: int) -> tuple[list[float], list[float]]:
        """FAKE, as ReplayEvaluator.interleave_with: :meth:`interleave_many` of one."""
        base, (times,) = self.interleave_many(other, mine, [theirs], rounds)
        return base, times

    def with_source(self, source: KernelSource) -> CompiledCostEvaluator:
        return type(self)(source)


class FactorCostEvaluator(CompiledCostEvaluator):
    """FAKE replay as :class:`CompiledCostEvaluator`, with times that follow a rule's factors
    instead of the source's text: each numeric ``R3_`` tunable at 4 takes a tenth off, one
    step either side of 4 a twentieth, so a child's factors gain where a climb moves them to
    4 (the block still counts; registers and the text do not)."""

    def time_of(self, config: TrialConfig, registers: int | None) -> float:
        block = config.block.volume if config.block else 256
        t = 100e-6 * (1 + abs(block - 256) / 512)
        for name, value in config.tunables.items():
            if name.startswith("R3_") and isinstance(value, int) and value >= 1:
                t *= 0.9 + 0.05 * min(2, abs(value.bit_length() - 3))
        return t
