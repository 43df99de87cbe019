"""What every inner search strategy shares: history, budget, warm start, resume.

A strategy is driven from outside (by the engine, a benchmark or a test)::

    search = BayesSearch(space, seed=7)
    search.warm_start(parent_best_configs)     # asked first
    while not search.done(budget):
        configs = search.ask(min(pool_size, search.remaining(budget) or pool_size))
        for config in configs:                 # compile + replay, done by other layers
            search.tell(config, measurement)   # a Measurement, a time in seconds, or a status

Failures are values: a compile error, wrong result, crash or timeout is told like a time and
kept in :attr:`InnerSearch.history`, never dropped.  A strategy does no I/O; after a crash the
engine rebuilds it with :meth:`InnerSearch.resume` from the trials it stored.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from r3tui.domain import Measurement, MeasurementStatus, TrialConfig
from r3tui.search.space import SearchSpace, SpaceError, config_key

Result = Measurement | float | MeasurementStatus


@dataclass(frozen=True)
class Budget:
    """When a search stops: after ``max_trials`` evaluations or ``max_seconds`` of wall time
    (from the first :meth:`InnerSearch.done` call), whichever comes first.  ``clock`` is
    injectable for tests."""

    max_trials: int | None = None
    max_seconds: float | None = None
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)


@dataclass(frozen=True)
class TrialRecord:
    """One told trial.  ``status`` None: the point was invalid and never evaluated."""

    config: TrialConfig
    status: MeasurementStatus | None
    time_s: float | None = None  # the measured median when the trial succeeded
    reason: str | None = None  # why it failed or was invalid

    @property
    def ok(self) -> bool:
        return self.status is MeasurementStatus.OK and self.time_s is not None

    @property
    def evaluated(self) -> bool:
        return self.status is not None

    @cached_property
    def key(self) -> str:
        # computed once: a search reads every record's key at each ask (session 33: 9,600
        # JSON encodings in a 200-trial campaign, a tenth of its asks' CPU)
        return config_key(self.config)

    @classmethod
    def of(cls, config: TrialConfig, result: Result) -> TrialRecord:
        """Normalise what a caller tells: a NaN, infinite or non-positive time is a failure."""
        if isinstance(result, Measurement):
            median = result.time.median_s if result.time is not None else None
            if result.ok and median is not None and math.isfinite(median) and median > 0:
                return cls(config, MeasurementStatus.OK, float(median))
            if result.ok:
                return cls(config, MeasurementStatus.CRASHED, None,
                           f"an ok measurement without a usable time ({median!r})")
            return cls(config, result.status, None, result.error_text)
        if isinstance(result, MeasurementStatus):
            if result is MeasurementStatus.OK:
                raise ValueError("tell a time or a Measurement for a successful trial")
            return cls(config, result, None)
        value = float(result)
        if math.isfinite(value) and value > 0:
            return cls(config, MeasurementStatus.OK, value)
        return cls(config, MeasurementStatus.CRASHED, None, f"time {value!r} is not usable")


def derive_seed(seed: int, *parts: Any) -> int:
    """A 31-bit seed from ``seed`` and ``parts``, the same in every process and Python run."""
    digest = hashlib.blake2b(repr((seed, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


class InnerSearch(ABC):
    """The interface of every inner strategy (:class:`~r3tui.search.bayes.BayesSearch`,
    :class:`RandomSearch`, :class:`ExhaustiveSearch`)."""

    name = "search"

    def __init__(self, space: SearchSpace, seed: int = 0) -> None:
        self.space = space
        self.seed = seed
        self.history: list[TrialRecord] = []
        self.invalid_count = 0  # invalid points the strategy proposed (told a penalty)
        self.exhausted = False  # every valid point has been asked
        self._pending: dict[str, TrialConfig] = {}
        self._seen: set[str] = set()
        self._warm: list[TrialConfig] = []
        self.prior: list[list[TrialRecord]] = []  # ancestors' trials, nearest first
        self._started: float | None = None
        self._elapsed_before = 0.0

    # -- the interface -------------------------------------------------------------------
    def warm_start(self, configs: Iterable[TrialConfig]) -> int:
        """Ask ``configs`` (a parent's best) first, each as this space completes it
        (:meth:`~r3tui.search.space.SearchSpace.completed`); returns how many are points of
        this space."""
        added = 0
        for config in configs:
            completed = self.space.completed(config)
            if completed is not None and completed not in self._warm:
                self._warm.append(completed)
                added += 1
        return added

    def known(self, config: TrialConfig) -> bool:
        """Whether ``config`` (as this space completes it) was tried or is pending; a config
        that is no point of the space counts as known (it will never be asked)."""
        completed = self.space.completed(config)
        return completed is None or self._known(config_key(completed))

    def extend(self, configs: Iterable[TrialConfig]) -> int:
        """Ask ``configs`` next (as :meth:`warm_start` does), those neither tried nor pending;
        returns how many that is: the trials a budget must grow by to ask them all."""
        fresh = [c for c in map(self.space.completed, configs)
                 if c is not None and not self._known(config_key(c))]
        self._warm = [c for c in self._warm if c not in fresh]
        return self.warm_start(fresh)

    def set_prior(self, groups: Iterable[Iterable[TrialRecord]]) -> int:
        """Trials of related searches (a child's parent, then grandparent, ...), nearest first.

        They are evidence, not history: nothing here is counted, re-timed or a finalist, and a
        strategy without a model (random, exhaustive) ignores them.  :class:`BayesSearch` tells
        its model the points of this space among them, each group shifted onto this search's
        scale.  Returns how many records are points of this space."""
        self.prior = []
        usable = 0
        for group in groups:
            records = [r for r in group if r.evaluated]
            usable += sum(1 for r in records if self.space.from_config(r.config) is not None)
            self.prior.append(records)
        return usable

    def ask(self, n: int = 1) -> list[TrialConfig]:
        """Up to ``n`` distinct configs, none evaluated or pending (fewer when the space runs
        out); each is valid and pending until told."""
        out: list[TrialConfig] = []
        taken: set[str] = set()
        for config in self._warm:
            key = config_key(config)
            if len(out) < n and not self._known(key) and key not in taken:
                out.append(config)
                taken.add(key)
        if len(out) < n:
            for config in self._propose(n - len(out), taken):
                out.append(config)
                taken.add(config_key(config))
        if not out and not self._pending:
            self.exhausted = True
        for config in out:
            self._pending[config_key(config)] = config
        return out

    def tell(self, config: TrialConfig, result: Result) -> TrialRecord:
        """Record ``config``'s result (a Measurement, a median time in seconds, or a failure
        status); failures stay in the history."""
        record = TrialRecord.of(config, result)
        self._record(record)
        return record

    def forget(self, config: TrialConfig) -> None:
        """Drop an asked ``config`` that will not be told (it was never measured: its batch
        ended on another configuration's hang), so it holds no trial of the budget and is
        no longer a pending point; a later ask may propose it again."""
        self._pending.pop(config_key(config), None)

    def resume(self, history: Iterable[TrialRecord | tuple[TrialConfig, Result]],
               elapsed_s: float = 0.0) -> None:
        """Rebuild the state from finished trials (in the order they were told), e.g. after a
        crash; pending asks are forgotten.  ``elapsed_s`` counts toward a time budget."""
        self._pending.clear()
        for item in history:
            record = item if isinstance(item, TrialRecord) else TrialRecord.of(*item)
            self._record(record)
        self._elapsed_before += elapsed_s

    def best(self) -> tuple[TrialConfig, float] | None:
        """The fastest successful config and its median time, or None before any success."""
        ok = [r for r in self.history if r.ok]
        if not ok:
            return None
        record = min(ok, key=lambda r: r.time_s or math.inf)
        assert record.time_s is not None
        return record.config, record.time_s

    def finalists(self, k: int) -> list[TrialConfig]:
        """The ``k`` fastest distinct successful configs, fastest first (to re-time)."""
        best: dict[str, TrialRecord] = {}
        for record in self.history:
            if record.ok and (record.key not in best
                              or (record.time_s or 0) < (best[record.key].time_s or 0)):
                best[record.key] = record
        ranked = sorted(best.values(), key=lambda r: r.time_s or math.inf)
        return [r.config for r in ranked[:k]]

    @property
    def n_evaluated(self) -> int:
        return sum(1 for r in self.history if r.evaluated)

    @property
    def pending(self) -> list[TrialConfig]:
        return list(self._pending.values())

    def elapsed(self, budget: Budget) -> float:
        if self._started is None:
            return self._elapsed_before
        return self._elapsed_before + budget.clock() - self._started

    def remaining(self, budget: Budget) -> int | None:
        """Trials still to ask under ``budget`` (None: no trial limit)."""
        if budget.max_trials is None:
            return None
        return max(0, budget.max_trials - self.n_evaluated - len(self._pending))

    def done(self, budget: Budget) -> bool:
        """No more asks are needed: the trial or time budget is spent (pending trials count),
        or the space is exhausted.  The first call starts the budget's clock."""
        if self._started is None:
            self._started = budget.clock()
        if self.exhausted and not self._pending:
            return True
        if budget.max_trials is not None and self.remaining(budget) == 0:
            return True
        return budget.max_seconds is not None and self.elapsed(budget) >= budget.max_seconds

    # -- for subclasses ------------------------------------------------------------------
    @abstractmethod
    def _propose(self, n: int, taken: set[str]) -> list[TrialConfig]:
        """Up to ``n`` new valid configs whose keys are not known nor in ``taken``."""

    def _known(self, key: str) -> bool:
        return key in self._seen or key in self._pending

    def _record(self, record: TrialRecord) -> None:
        key = record.key
        self._pending.pop(key, None)
        self._seen.add(key)
        self.history.append(record)
        if record.status is None:
            self.invalid_count += 1

    def _fresh_random(self, n: int, taken: set[str], rng: random.Random) -> list[TrialConfig]:
        """``n`` uniformly drawn valid configs not known nor taken (fewer when few are left)."""
        out: list[TrialConfig] = []
        misses = 0
        while len(out) < n and misses < 200:
            config = self.space.to_config(self.space.sample(rng)[0])
            key = config_key(config)
            if self._known(key) or key in taken:
                misses += 1
                continue
            out.append(config)
            taken.add(key)
        if len(out) < n:  # nearly exhausted: pick among what is left, if it can be listed
            try:
                rest = [c for c in self.space.enumerate()
                        if not self._known(config_key(c)) and config_key(c) not in taken]
            except SpaceError:
                return out
            rng.shuffle(rest)
            out.extend(rest[: n - len(out)])
        return out


class RandomSearch(InnerSearch):
    """Uniform over the valid configs, without repeats, seeded: the benchmark's baseline."""

    name = "random"

    def _propose(self, n: int, taken: set[str]) -> list[TrialConfig]:
        rng = random.Random(derive_seed(self.seed, "random", len(self.history),
                                        len(self._pending)))
        return self._fresh_random(n, taken, rng)


class ExhaustiveSearch(InnerSearch):
    """Every valid config in :meth:`SearchSpace.enumerate` order (small spaces only)."""

    name = "exhaustive"

    def __init__(self, space: SearchSpace, seed: int = 0, limit: int = 100_000) -> None:
        super().__init__(space, seed)
        self._total = space.size()
        if self._total > limit:
            raise SpaceError(f"exhaustive search over {self._total} points (limit {limit})")
        self._cursor = 0

    def _propose(self, n: int, taken: set[str]) -> list[TrialConfig]:
        out: list[TrialConfig] = []
        while len(out) < n and self._cursor < self._total:
            config = self.space.to_config(self.space.point_at(self._cursor))
            self._cursor += 1
            key = config_key(config)
            if not self._known(key) and key not in taken:
                out.append(config)
        return out
