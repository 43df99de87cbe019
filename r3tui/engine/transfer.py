"""A campaign's winner measured on the other recorded configurations of its kernel.

``r3 tune-app`` searches one configuration of a kernel (the replayable one with the most
device time), but what ``r3 apply`` ships -- the source, the flags, the bounds, a block
macro -- changes every launch of that kernel.  Taking the tuned configuration's speedup for
all of them mispredicts where the configurations differ: on the H200 (2026-12-04) rmsnorm's
winner gave 1.572x on its tuned configuration, which held 24.8% of the kernel's time, and
``r3 apply`` measured 1.268x over the whole kernel.

So after the campaign the winner (its variant at its configuration) is re-timed against the
original, interleaved, on each other configuration that has a bundle (the largest first, at
most ``max_checks``), each in a replay worker of its own.  The kernel's predicted speedup is
Amdahl within the kernel: every checked configuration at its own ratio; the configurations
without a bundle (or beyond ``max_checks``) at the median of the measured ratios.  A winner
that fails verification on another configuration is not shipped: it would compute wrong
results in those launches.

The winner's compiler options reach every kernel of its translation unit (``r3 apply``
writes them into the build's flags), so the other kernels recorded from that unit, which no
campaign of the run ships, are replayed too: each one's original with the winner's options
against itself without them.  Their ratios join the prediction (cfd on the H200: its flux
kernel's options made the unit's other kernels faster, and the kernel-time prediction
without them was 5.5% below the measured 1.423x), and a kernel the options make wrong stops
the winner from shipping.

The checks go into the campaign's ``configs`` and ``unit`` events, where ``r3 apply`` reads
them.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from r3tui.domain import TrialConfig
    from r3tui.engine.app_recording import KernelShare, RecordedConfig

EVENT = "configs"
UNIT_EVENT = "unit"
MAX_CHECKS = 3  # other configurations re-timed per kernel (each starts a replay worker)
# a kernel speedup is uncertain (uncertainty()) with this share of the kernel's time not
# re-timed, where the re-timed configurations' ratios spread this far
UNCERTAIN_SHARE = 0.10
UNCERTAIN_SPREAD = 1.10
ROUNDS = 9  # interleaved rounds per configuration


@dataclass(frozen=True)
class ConfigCheck:
    """The winner on one other configuration of its kernel."""

    bundle: str  # relative to the recording directory
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    share: float  # of all kernels' device time
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    failed: str | None = None  # why the winner is wrong there (it must not ship)
    skipped: str | None = None  # why it was not measured (the original did not replay, ...)
    from_launch: int = 1  # a later stratum of its grid and block: the launch it began at

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ConfigCheck:
        ci = data.get("ci")
        return cls(str(data["bundle"]), tuple(data["grid"]), tuple(data["block"]),
                   float(data["share"]), data.get("speedup"),
                   (float(ci[0]), float(ci[1])) if ci else None, data.get("failed"),
                   data.get("skipped"))


@dataclass(frozen=True)
class UnitCheck:
    """Another kernel of the winner's unit, its original with and without the winner's
    compiler options (on its largest replayable configuration)."""

    kernel: str
    entry_point: str
    bundle: str  # relative to the recording directory
    share: float  # the kernel's share of all kernels' device time, every configuration
    options: tuple[str, ...] = ()
    speedup: float | None = None
    ci: tuple[float, float] | None = None
    failed: str | None = None
    skipped: str | None = None


class Checker(Protocol):
    """Re-times a campaign's winner -- the GPU part (:class:`GpuChecker`), a fake in tests."""

    def configs(self, campaign_id: int, configs: Sequence[RecordedConfig]
                ) -> list[ConfigCheck]:
        """The winner on these other configurations of its kernel."""
        ...

    def unit(self, campaign_id: int, kernels: Sequence[KernelShare]) -> list[UnitCheck]:
        """The winner's compiler options on these other kernels of its unit ([] where the
        winner has none)."""
        ...

    def without_options(self, campaign_id: int, bundle: Path
                        ) -> tuple[float, tuple[float, float]] | None:
        """The winner without its compiler options, re-timed on ``bundle`` (its tuned
        configuration) and stored as the campaign's verdict where it is faster beyond the
        noise: (speedup, interval); None where it has no options or is not."""
        ...


def others(kernel: KernelShare, tuned: RecordedConfig, max_checks: int = MAX_CHECKS
           ) -> list[RecordedConfig]:
    """The configurations of ``kernel`` to check: replayable, with a bundle, not the tuned one,
    the most device time first."""
    found = [c for c in kernel.configs
             if c is not tuned and c.replayable and c.bundle is not None]
    return sorted(found, key=lambda c: -c.device_time_s)[:max(0, max_checks)]


def _measured(tuned_share: float, tuned_speedup: float, checks: Sequence[ConfigCheck]
              ) -> list[tuple[float, float]]:
    """(share, ratio) of the tuned configuration and of each other one re-timed."""
    return [(tuned_share, tuned_speedup)] + [
        (c.share, c.speedup) for c in checks
        if c.speedup is not None and c.speedup > 0 and c.failed is None]


def kernel_speedup(kernel_share: float, tuned_share: float, tuned_speedup: float,
                   checks: Sequence[ConfigCheck]) -> tuple[float, str]:
    """The winner's speedup over all of the kernel's device time, and how it was formed.

    Each configuration counts at its measured ratio; the rest of the kernel's share (no
    bundle, not checked, or not measurable) at the median of the measured ratios."""
    measured = _measured(tuned_share, tuned_speedup, checks)
    if kernel_share <= 0:
        return tuned_speedup, "the tuned configuration's ratio"
    covered = sum(share for share, _ in measured)
    rest = max(0.0, kernel_share - covered)
    typical = statistics.median(r for _, r in measured)
    time_after = sum(share / r for share, r in measured) + rest / typical
    how = (f"{len(measured)} configuration(s) measured, {covered / kernel_share:.0%} of the "
           "kernel's time" + (f"; the other {rest / kernel_share:.0%} at their median ratio "
                              f"{typical:.3f}" if rest > 1e-12 else ""))
    return kernel_share / time_after, how


def uncertainty(name: str, kernel_share: float, tuned_share: float, tuned_speedup: float,
                checks: Sequence[ConfigCheck]) -> str | None:
    """Why :func:`kernel_speedup` may be far off: at least :data:`UNCERTAIN_SHARE` of the
    kernel's time was not re-timed, and the configurations that were gained unlike amounts
    (the fastest ratio :data:`UNCERTAIN_SPREAD` times the slowest or more), so the median
    that stands for the rest is a guess.  gaussian's Fan2 (H100, session 48): half of its
    time in strata without a snapshot, counted at 10.8x, where the measured ones ranged
    9.1x-16.4x and the whole gained 17.5x.  None where it is not so."""
    measured = _measured(tuned_share, tuned_speedup, checks)
    rest = kernel_share - sum(share for share, _ in measured)
    ratios = [r for _, r in measured]
    if (kernel_share <= 0 or rest < UNCERTAIN_SHARE * kernel_share - 1e-12
            or max(ratios) < UNCERTAIN_SPREAD * min(ratios)):
        return None
    return (f"{name}: {rest / kernel_share:.0%} of its device time is in configurations not "
            "re-timed (without a snapshot, or past --check-configs), counted at the median "
            f"of those that were, which gained {min(ratios):.3f}x to {max(ratios):.3f}x: "
            "the prediction may be far off (a larger `r3 record --max-snapshot-bytes` or "
            "--check-configs measures more of them)")


def neighbours(kernels: Sequence[KernelShare], kernel: KernelShare,
               shipped: Collection[str], max_checks: int | None = None) -> list[KernelShare]:
    """The other kernels recorded from ``kernel``'s unit that have a replayable configuration
    and that no campaign in ``shipped`` (entry points) ships itself, the most device time
    first (at most ``max_checks``: the rest count as unchanged)."""
    if kernel.unit is None:
        return []
    found = [k for k in kernels if k.unit == kernel.unit and k.entry_point != kernel.entry_point
             and k.entry_point not in shipped and k.target is not None]
    found.sort(key=lambda k: -k.device_time_s)
    return found if max_checks is None else found[:max(0, max_checks)]


def failure(checks: Sequence[ConfigCheck | UnitCheck]) -> str | None:
    """Why the winner must not ship (it, or its options, failed verification elsewhere)."""
    bad = [c for c in checks if c.failed is not None]
    if not bad:
        return None
    c = bad[0]
    if isinstance(c, UnitCheck):
        return (f"its options ({' '.join(c.options)}) make another kernel of the unit, "
                f"{c.kernel}, fail: {c.failed}")
    return (f"the winner fails on another configuration of the kernel (grid "
            f"{'x'.join(map(str, c.grid))}, block {'x'.join(map(str, c.block))}): {c.failed}")


# -- the event -------------------------------------------------------------------------------
def _add_event(db: Path, campaign_id: int, kind: str, message: str,
               data: dict[str, Any]) -> None:
    from db import repository as repo
    from db.session import open_database

    with open_database(db, create=False) as database, database.session_scope() as s:
        repo.add_event(s, campaign_id, kind, message[:500], data)


def store(db: Path, campaign_id: int, checks: Sequence[ConfigCheck], speedup: float,
          how: str, uncertain: str | None = None) -> None:
    why = failure(checks)
    message = why or f"the winner over every configuration: {speedup:.3f}x ({how})"
    _add_event(db, campaign_id, EVENT, message, {
        "checks": [asdict(c) for c in checks], "kernel_speedup": speedup, "how": how,
        "failed": why, "uncertain": uncertain})


def store_unit(db: Path, campaign_id: int, checks: Sequence[UnitCheck]) -> None:
    why = failure(checks)
    parts = ", ".join(f"{c.kernel} {c.speedup:.3f}x" for c in checks if c.speedup is not None)
    message = why or f"its options on the unit's other kernels: {parts or 'not measured'}"
    _add_event(db, campaign_id, UNIT_EVENT, message,
               {"checks": [asdict(c) for c in checks], "failed": why})


def store_without_options(db: Path, campaign_id: int, variant_id: int, config: TrialConfig,
                          dropped: Sequence[str], speedup: float,
                          ci: tuple[float, float]) -> None:
    """The campaign's verdict is now its winner without ``dropped`` (its compiler options,
    which made another kernel of the unit fail): a ``final`` event, the last of which
    ``r3 apply`` ships (:func:`r3tui.engine.campaign_winner.campaign_decision`)."""
    _add_event(db, campaign_id, "final",
               f"the winner without its options ({' '.join(dropped)}), which made another "
               f"kernel of its unit fail: {speedup:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]",
               {"variant_id": variant_id, "config": config.to_json(), "speedup": speedup,
                "ci": list(ci), "dropped_options": list(dropped)})
    # without options it reaches no other kernel: the unit's check that failed is moot
    _add_event(db, campaign_id, UNIT_EVENT,
               "no options: the unit's other kernels are built as before",
               {"checks": [], "failed": None})


def stored(s: Any, campaign_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The data of the campaign's last ``configs`` and last ``unit`` events ({} for one it
    does not have), from one read of its events."""
    from db import repository as repo

    last: dict[str, dict[str, Any]] = {}
    for e in repo.events(s, campaign_id, limit=1_000_000):
        if e.kind in (EVENT, UNIT_EVENT) and e.data:
            last[e.kind] = e.data
    return last.get(EVENT, {}), last.get(UNIT_EVENT, {})


def unit_parts(data: dict[str, Any] | None) -> list[tuple[str, float, float]]:
    """(entry point, share, speedup) of each measured neighbour in a ``unit`` event."""
    return [(str(c["entry_point"]), float(c["share"]), float(c["speedup"]))
            for c in (data or {}).get("checks", ())
            if c.get("speedup") and not c.get("failed")]


# -- on the GPU ------------------------------------------------------------------------------
def winner_of(db: Path, campaign_id: int) -> tuple[str, TrialConfig] | None:
    """The source and configuration ``r3 apply`` would ship for the campaign (None: none)."""
    found = decision_of(db, campaign_id)
    return None if found is None else (found[1], found[2])


def decision_of(db: Path, campaign_id: int) -> tuple[int, str, TrialConfig] | None:
    """The variant id, source and configuration of the campaign's verdict (None: none)."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.engine.campaign_winner import campaign_decision
    from r3tui.engine.report import build_report

    with open_database(db, readonly=True, create=False) as database, \
            database.session_scope() as s:
        report = build_report(s, campaign_id)
        if report.best_variant is None:
            return None
        decision = campaign_decision(s, campaign_id, report.best_variant.id)
        if decision is None:
            return None
        variant = repo.get_variant(s, decision.variant_id)
        if variant is None:
            return None
        return decision.variant_id, variant.source, decision.config


def retime(bundle_path: Path, text: str | None, config: TrialConfig, *, rounds: int = ROUNDS,
           timeout_s: float = 60.0) -> tuple[float | None, tuple[float, float] | None,
                                             str | None, str | None]:
    """``text`` at ``config`` against the bundle's original at its recorded configuration,
    interleaved, ``rounds`` at a time while the interval is wide (``comparison.confirm``):
    (speedup, ci, failed, skipped).  ``text`` None: the bundle's original itself (what
    ``config``'s options alone do to it)."""
    from r3tui.engine.comparison import confirm
    from r3tui.engine.gpu import RunnerSettings, open_runner
    from r3tui.engine.inner import (
        InnerSettings,
        ReplayEvaluator,
        build_space,
        device_limits,
        with_app_limits,
    )
    from r3tui.engine.unit_source import searched_launch, seed_unit
    from r3tui.errors import R3Error
    from r3tui.record.bundle import Bundle

    # a check that cannot run (the bundle, its worker, its arena) is skipped with the reason:
    # it must not end the tune-app run whose campaigns are done
    try:
        bundle = Bundle.open(bundle_path, verify=True)
        seed = seed_unit(bundle)
        launch, _ = searched_launch(bundle, seed)
        settings = with_app_limits(InnerSettings(toolchain=config.toolchain), bundle_path)
        # two candidates re-timed on one GPU: no replay worker on the others
        with open_runner(bundle_path, timeout_s, RunnerSettings(gpus=1)) as runner:
            space = build_space(launch, seed.source, settings, device_limits(runner.info))
            baseline = replace(space.baseline_config(), toolchain=config.toolchain)
            original = ReplayEvaluator(seed.source, runner)
            tuned = original.with_source(replace(seed.source, text=text or seed.source.text))
            (first,) = original.evaluate([baseline])
            if not first.ok:
                return None, None, None, f"the original does not replay here: {_why(first)}"
            (mine,) = tuned.evaluate([config])
            if not mine.ok:
                return None, None, _why(mine), None
            # rounds added while the interval is wide, as the campaign's own final figure
            f = confirm(config, lambda n: original.interleave_with(tuned, baseline, config, n),
                        batch=rounds)
    except (R3Error, ValueError) as exc:
        one = exc.one_line() if isinstance(exc, R3Error) else f"{type(exc).__name__}: {exc}"
        return None, None, None, one
    return f.speedup, (f.low, f.high), None, None


def _why(m: Any) -> str:
    return f"{m.status.value}: {m.error_text}" if m.error_text else str(m.status.value)


@dataclass(frozen=True)
class GpuChecker:
    """Re-times each campaign's winner on the GPU, one replay worker per bundle."""

    db: Path
    recording_dir: Path
    rounds: int = ROUNDS
    timeout_s: float = 60.0

    def configs(self, campaign_id: int, configs: Sequence[RecordedConfig]
                ) -> list[ConfigCheck]:
        winner = winner_of(self.db, campaign_id)
        if winner is None:
            return []
        text, config = winner
        out = []
        for c in configs:
            assert c.bundle is not None
            speedup, ci, failed, skipped = retime(c.bundle, text, config, rounds=self.rounds,
                                                  timeout_s=self.timeout_s)
            out.append(ConfigCheck(str(c.bundle.relative_to(self.recording_dir)), c.grid,
                                   c.block, c.share, speedup, ci, failed, skipped,
                                   c.from_launch))
        return out

    def unit(self, campaign_id: int, kernels: Sequence[KernelShare]) -> list[UnitCheck]:
        from r3tui.domain import TrialConfig

        winner = winner_of(self.db, campaign_id)
        if winner is None or not winner[1].options:
            return []
        options = tuple(winner[1].options)
        flagged = TrialConfig(toolchain=winner[1].toolchain, options=options)
        out = []
        for k in kernels:
            target = k.target
            assert target is not None and target.bundle is not None
            where = str(target.bundle.relative_to(self.recording_dir))
            speedup, ci, failed, skipped = retime(target.bundle, None, flagged,
                                                  rounds=self.rounds, timeout_s=self.timeout_s)
            out.append(UnitCheck(k.name, k.entry_point, where, k.share, options, speedup, ci,
                                 failed, skipped))
        return out

    def without_options(self, campaign_id: int, bundle: Path
                        ) -> tuple[float, tuple[float, float]] | None:
        from r3tui.search.winner import beyond_noise

        found = decision_of(self.db, campaign_id)
        if found is None or not found[2].options:
            return None
        variant_id, text, config = found
        bare = replace(config, options=())
        speedup, ci, failed, _ = retime(bundle, text, bare, rounds=self.rounds,
                                        timeout_s=self.timeout_s)
        if speedup is None or ci is None or failed is not None or not beyond_noise(ci):
            return None
        store_without_options(self.db, campaign_id, variant_id, bare, config.options,
                              speedup, ci)
        return speedup, ci
