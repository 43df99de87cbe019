"""Declaring a winner under timing noise: re-time the finalists interleaved with the baseline.

A search's best time is the minimum over many noisy measurements, so it is biased low (the
winner's curse).  Before a variant's speedup is reported, its best few configs are timed again
together with the baseline, in rounds (``baseline, f1, f2, ...`` then again), so that drift
(clocks, temperature, other tenants) hits all of them alike.  Each round gives one ratio
``baseline time / finalist time`` per finalist; the speedup is the median of those ratios and its
spread the interquartile range and a distribution-free confidence interval of that median
(two order statistics whose binomial coverage is at least the confidence asked).

Everything here is pure: the caller passes ``retime``, which does the timing on the GPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from r3tui.domain import TrialConfig
from r3tui.search.space import config_key

# retime(configs, rounds) -> samples, samples[r][i] = seconds of configs[i] in round r
# (NaN or inf where that launch failed).
Retime = Callable[[Sequence[TrialConfig], int], Sequence[Sequence[float]]]


def beyond_noise(ci: tuple[float, float] | None) -> bool:
    """A speedup interval that says "faster": all of it above 1 (None: never re-timed)."""
    return ci is not None and ci[0] > 1.0


@dataclass(frozen=True)
class Finalist:
    """One re-timed config: its per-round speedups over the baseline and their summary."""

    config: TrialConfig
    speedup: float  # median of the per-round ratios (nan without a usable round)
    low: float  # distribution-free confidence interval of that median
    high: float
    iqr: float
    median_s: float
    ratios: tuple[float, ...]
    confidence: float = 0.95  # what the interval was asked to cover
    coverage: float = 0.95  # what it covers (less with fewer rounds than that needs)

    @property
    def significant(self) -> bool:
        """Faster than the baseline beyond the noise: the whole interval is above 1, and it
        covers what it was asked to (5 rounds all faster happen 1 time in 16 by chance)."""
        return self.coverage >= self.confidence and beyond_noise((self.low, self.high))


@dataclass(frozen=True)
class Winner:
    """The fastest finalist, with the evidence (every finalist, ranked)."""

    best: Finalist
    baseline_median_s: float
    ranking: tuple[Finalist, ...]
    rounds: int
    confidence: float

    @property
    def config(self) -> TrialConfig:
        return self.best.config

    @property
    def speedup(self) -> float:
        return self.best.speedup


def _quantile(ordered: Sequence[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def median_ci_coverage(n: int, confidence: float) -> float:
    """What :func:`order_statistic_median_ci` of ``n`` values covers: ``confidence`` or more
    from the pairs it needs on (6 at 95%), less below (the whole range: ``1 - 2 / 2**n``)."""
    if n < 2:
        return 0.0
    best = 1 - 2 / 2**n
    for k in range(2, n // 2 + 1):
        tail = sum(math.comb(n, i) for i in range(k)) / 2**n
        if 1 - 2 * tail >= confidence:
            best = 1 - 2 * tail
    return best


def pairs_for(confidence: float) -> int:
    """The fewest values whose order-statistic interval of the median covers ``confidence``
    (6 at 95%, 8 at 99%)."""
    n = 2
    while 1 - 2 / 2**n < confidence:
        n += 1
    return n


def order_statistic_median_ci(values: Sequence[float],
                              confidence: float) -> tuple[float, float]:
    """Distribution-free interval of the median: the order statistics ``x(k)`` and
    ``x(n+1-k)`` with the largest ``k`` whose binomial coverage is at least ``confidence``.
    Honest for a handful of values, where the percentile bootstrap of a median covers far
    less than it says (10 values at 95%: the bootstrap's interval is about x(3)..x(8), 89%).
    Below 6 values no pair of order statistics reaches 95%: the whole range is returned
    (5 values: 93.8%)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 1:
        return ordered[0], ordered[0]
    best = 1
    for k in range(1, n // 2 + 1):
        # P(x(k) <= median <= x(n+1-k)) = 1 - 2 P(Binomial(n, 1/2) <= k - 1)
        tail = sum(math.comb(n, i) for i in range(k)) / 2**n
        if 1 - 2 * tail >= confidence:
            best = k
    return ordered[best - 1], ordered[n - best]


def summarize(config: TrialConfig, baseline: Sequence[float], times: Sequence[float],
              confidence: float = 0.95) -> Finalist:
    """Per-round ratios ``baseline[r] / times[r]`` (rounds where either failed are dropped)."""
    ratios = tuple(b / t for b, t in zip(baseline, times, strict=True)
                   if math.isfinite(b) and math.isfinite(t) and b > 0 and t > 0)
    finite = sorted(t for t in times if math.isfinite(t) and t > 0)
    median_s = statistics.median(finite) if finite else math.nan
    if not ratios:
        return Finalist(config, math.nan, math.nan, math.nan, math.nan, median_s, ())
    ordered = sorted(ratios)
    # the order-statistic interval, as r3 apply's: a percentile bootstrap of 9 rounds' median
    # covers about 89% where it says 95%
    low, high = order_statistic_median_ci(ratios, confidence)
    return Finalist(config, statistics.median(ratios), low, high,
                    _quantile(ordered, 0.75) - _quantile(ordered, 0.25), median_s, ratios,
                    confidence, median_ci_coverage(len(ratios), confidence))


def choose_winner(finalists: Sequence[TrialConfig], baseline: TrialConfig, retime: Retime,
                  rounds: int = 9, confidence: float = 0.95) -> Winner:
    """Re-time ``finalists`` interleaved with ``baseline`` and rank them by median speedup.

    ``retime`` gets ``[baseline, *finalists]`` (repeats removed, the baseline first) and the
    number of rounds.  A finalist equal to the baseline is timed once and has speedup 1.
    The best is the highest median speedup (ties: the lower median time) among the finalists
    and the baseline itself: when every finalist re-times slower than the recorded
    configuration, the recorded configuration wins at 1.0 (the search found nothing better,
    and tune-app / apply must not ship a slowdown).  Check :attr:`Finalist.significant`
    before calling the winner faster.
    """
    if not finalists:
        raise ValueError("choose_winner needs at least one finalist")
    if rounds < 1:
        raise ValueError("choose_winner needs at least one round")
    base_key = config_key(baseline)
    configs: list[TrialConfig] = [baseline]
    keys = {base_key}
    for config in finalists:
        if config_key(config) not in keys:
            keys.add(config_key(config))
            configs.append(config)
    samples = [list(row) for row in retime(configs, rounds)]
    if len(samples) != rounds or any(len(row) != len(configs) for row in samples):
        raise ValueError(f"retime returned {len(samples)} rounds for {len(configs)} configs, "
                         f"expected {rounds} rounds of {len(configs)}")
    columns = [[row[i] for row in samples] for i in range(len(configs))]
    baseline_times = columns[0]
    ranking = [summarize(config, baseline_times, columns[i], confidence)
               for i, config in enumerate(configs)]
    # the baseline always competes (ranking[0], speedup 1.0 when it ran)
    wanted = [f for f in ranking if config_key(f.config) in
              {config_key(c) for c in finalists} | {base_key}]

    def order(f: Finalist) -> tuple[float, float]:
        speed = f.speedup if math.isfinite(f.speedup) else -math.inf
        time = f.median_s if math.isfinite(f.median_s) else math.inf
        return (-speed, time)

    wanted.sort(key=order)
    finite_base = [t for t in baseline_times if math.isfinite(t) and t > 0]
    return Winner(best=wanted[0],
                  baseline_median_s=statistics.median(finite_base) if finite_base else math.nan,
                  ranking=tuple(wanted), rounds=rounds, confidence=confidence)
