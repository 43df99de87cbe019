"""Simulation mode: run a search strategy against recorded measurements instead of a GPU.

As in Kernel Tuner's simulation mode, every config of a (small) space is compiled and replayed
once on a real GPU and the results are stored; a strategy is then evaluated by looking its asks
up in that table, so strategies can be compared on CPU, in seconds, and reproducibly.

A recorded space file (``tests/data/spaces/<example>.json``) is::

    {
      "format": 1,
      "example": "stencil7",                       # which example kernel
      "gpu": "NVIDIA H200 (sm_90), driver 580",     # where it was measured
      "recorded_at": "2026-12-03T10:00:00Z",
      "command": "python bench/record_space.py stencil7 ...",
      "space": {...},                              # SearchSpace.describe(): rebuilds the space
      "measurements": [
        {"config": TrialConfig.to_json(), "status": "ok", "median_s": 9.5e-05, "n": 50},
        {"config": {...}, "status": "compile_error", "median_s": null, "n": 0},
        ...
      ]
    }

``status`` is a :class:`~r3tui.domain.MeasurementStatus` value.  This module reads no files:
:func:`parse_space_file` takes the already-loaded dict and :func:`space_file` builds one.
:func:`run_search` and :func:`compare` are the exact logic the benchmark and the tests share.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from r3tui.domain import Measurement, MeasurementStatus, TimeStats, TrialConfig
from r3tui.search.bayes import BayesSearch, BayesSettings
from r3tui.search.space import SearchSpace, SpaceError, config_key
from r3tui.search.strategy import Budget, ExhaustiveSearch, InnerSearch, RandomSearch

FORMAT = 1
# strategy name -> how to make its search (space, seed, the Bayesian search's settings)
SEARCHES: dict[str, Callable[[SearchSpace, int, BayesSettings | None], InnerSearch]] = {
    BayesSearch.name: lambda space, seed, settings: BayesSearch(space, seed=seed,
                                                                settings=settings),
    RandomSearch.name: lambda space, seed, _settings: RandomSearch(space, seed=seed),
    ExhaustiveSearch.name: lambda space, seed, _settings: ExhaustiveSearch(space, seed=seed),
}
STRATEGIES = tuple(SEARCHES)


@dataclass(frozen=True)
class RecordedResult:
    """One config's recorded outcome."""

    status: MeasurementStatus
    median_s: float | None = None
    n: int = 0

    def measurement(self) -> Measurement:
        if self.status is MeasurementStatus.OK and self.median_s is not None:
            stats = TimeStats(self.median_s, self.median_s, 0.0, max(self.n, 1))
            return Measurement(MeasurementStatus.OK, time=stats, verified=True)
        return Measurement(self.status, error_text="recorded failure")


class SimulatedEvaluator:
    """Answers ``evaluate(config)`` from a table of recorded results keyed by
    :func:`~r3tui.search.space.config_key`.  A config missing from the table is an error
    (``missing="raise"``, the default: the table must cover every config the space offers) or a
    crash (``missing="crash"``)."""

    def __init__(self, table: Mapping[str, RecordedResult], missing: str = "raise") -> None:
        if missing not in ("raise", "crash"):
            raise ValueError("missing must be 'raise' or 'crash'")
        self.table = dict(table)
        self.missing = missing
        self.calls = 0

    def evaluate(self, config: TrialConfig) -> Measurement:
        self.calls += 1
        result = self.table.get(config_key(config))
        if result is None:
            if self.missing == "raise":
                raise KeyError(f"config not in the recorded table: {config_key(config)}")
            return Measurement(MeasurementStatus.CRASHED, error_text="not recorded")
        return result.measurement()

    def optimum(self) -> float:
        """The fastest recorded time."""
        times = [r.median_s for r in self.table.values()
                 if r.status is MeasurementStatus.OK and r.median_s is not None]
        if not times:
            raise SpaceError("the recorded table has no successful measurement")
        return min(times)


@dataclass(frozen=True)
class SpaceFile:
    example: str
    gpu: str
    recorded_at: str
    command: str
    space: SearchSpace
    table: dict[str, RecordedResult]


def parse_space_file(data: Mapping[str, Any]) -> SpaceFile:
    """A recorded space file's content (see the module docstring), validated."""
    try:
        if int(data.get("format", FORMAT)) != FORMAT:
            raise SpaceError(f"recorded space format {data.get('format')} is not {FORMAT}")
        space = SearchSpace.from_description(data["space"])
        table: dict[str, RecordedResult] = {}
        for item in data["measurements"]:
            config = TrialConfig.from_json(item["config"])
            status = MeasurementStatus(item["status"])
            median = item.get("median_s")
            if status is MeasurementStatus.OK and (
                median is None or not math.isfinite(float(median)) or float(median) <= 0
            ):
                raise SpaceError(f"ok measurement without a usable median: {item!r}")
            table[config_key(config)] = RecordedResult(
                status, None if median is None else float(median), int(item.get("n", 0)))
        return SpaceFile(str(data["example"]), str(data["gpu"]), str(data["recorded_at"]),
                         str(data["command"]), space, table)
    except SpaceError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise SpaceError(f"bad recorded space file: {exc!r}") from None


def space_file(example: str, gpu: str, recorded_at: str, command: str, space: SearchSpace,
               measurements: Iterable[tuple[TrialConfig, Measurement]]) -> dict[str, Any]:
    """The JSON-ready content of a recorded space file (the caller writes it)."""
    rows = []
    for config, measurement in measurements:
        stats = measurement.time
        rows.append({"config": config.to_json(), "status": measurement.status.value,
                     "median_s": stats.median_s if measurement.ok and stats else None,
                     "n": stats.n if stats else 0})
    return {"format": FORMAT, "example": example, "gpu": gpu, "recorded_at": recorded_at,
            "command": command, "space": space.describe(), "measurements": rows}


def make_search(strategy: str, space: SearchSpace, seed: int,
                settings: BayesSettings | None = None) -> InnerSearch:
    """A search of ``strategy`` (:data:`SEARCHES`); ``settings`` go to the Bayesian one."""
    make = SEARCHES.get(strategy)
    if make is None:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    return make(space, seed, settings)


def run_search(search: InnerSearch, evaluate: Callable[[TrialConfig], Measurement],
               n_evals: int, batch: int = 1) -> list[float]:
    """Drive ``search`` for ``n_evals`` evaluations; the best time after each (inf before the
    first success).  Shorter when the space runs out."""
    budget = Budget(max_trials=n_evals)
    trace: list[float] = []
    best = math.inf
    while not search.done(budget):
        configs = search.ask(min(batch, search.remaining(budget) or batch))
        if not configs:
            break
        for config in configs:
            record = search.tell(config, evaluate(config))
            if record.ok and record.time_s is not None:
                best = min(best, record.time_s)
            trace.append(best)
    return trace


def lineage_best(space: SearchSpace, evaluator: SimulatedEvaluator, seed: int, prior: bool,
                 factor: float = 0.9, settings: BayesSettings | None = None,
                 child_settings: BayesSettings | None = None) -> float:
    """A campaign's lineage on a recorded table, as :mod:`~r3tui.engine.campaign` runs one:
    the original source searched 12 trials, then four generations of children, 5 trials each
    (the parent's best and the recorded config first; told their ancestors' trials when
    ``prior``), whose source runs every config ``factor`` times as long as the original (a
    source change that does not move the optimum).  The best time over the lineage, on the
    children's scale.  ``child_settings`` (default: ``settings``) drive the children."""

    def child_time(config: TrialConfig) -> Measurement:
        m = evaluator.evaluate(config)
        if not (m.ok and m.time):
            return m
        t = m.time.median_s * factor
        return Measurement(MeasurementStatus.OK, time=TimeStats(t, t, 0.0, 1), verified=True)

    parent: InnerSearch = BayesSearch(space, seed=seed, settings=settings)
    parent.warm_start([space.baseline_config()])
    best = run_search(parent, evaluator.evaluate, 12)[-1] * factor
    lineage = [parent.history]
    for generation in range(4):
        child = BayesSearch(space, seed=seed * 100 + generation + 1,
                            settings=child_settings or settings)
        child.warm_start(parent.finalists(1))
        child.warm_start([space.baseline_config()])
        if prior:
            child.set_prior(reversed(lineage))
        best = min(best, run_search(child, child_time, 5)[-1])
        lineage.append(child.history)
        parent = child
    return best


def best_at(trace: Sequence[float], n: int) -> float:
    """Best time within the first ``n`` evaluations (the last value of a shorter trace)."""
    if not trace:
        return math.inf
    return trace[min(n, len(trace)) - 1]


@dataclass(frozen=True)
class StrategyScore:
    strategy: str
    n_evals: int
    best_s: tuple[float, ...]  # per seed: best time after n_evals
    optimum_s: float

    @property
    def median_best_s(self) -> float:
        return statistics.median(self.best_s)

    @property
    def median_fraction(self) -> float:
        """Median over seeds of optimum / best (1.0: every seed found the optimum)."""
        return statistics.median(self.optimum_s / b if b > 0 else 0.0 for b in self.best_s)


def score(strategy: str, space: SearchSpace, evaluator: SimulatedEvaluator,
          n_evals: Sequence[int], seeds: Iterable[int], batch: int = 1,
          settings: BayesSettings | None = None) -> dict[int, StrategyScore]:
    """Run ``strategy`` once per seed for ``max(n_evals)`` evaluations; its score at each
    evaluation count in ``n_evals``."""
    horizon = max(n_evals)
    traces = [run_search(make_search(strategy, space, seed, settings), evaluator.evaluate,
                         horizon, batch) for seed in seeds]
    optimum = evaluator.optimum()
    return {n: StrategyScore(strategy, n, tuple(best_at(t, n) for t in traces), optimum)
            for n in n_evals}


def beats(a: StrategyScore, b: StrategyScore) -> bool:
    """``a`` has a lower median best time than ``b``, or both medians are the optimum."""
    return a.median_best_s < b.median_best_s or (
        a.median_best_s == b.median_best_s == a.optimum_s)
