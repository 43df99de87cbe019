"""Bayesian optimization of one variant's config with scikit-optimize, driven by ask/tell.

How the optimizer is used, and why (scikit-optimize 0.10.2, scikit-learn 1.9, numpy 2.4):

- **The state is the history.**  Each :meth:`BayesSearch.ask` builds a fresh
  ``skopt.Optimizer`` (seeded from the search seed and the history length), tells it every
  finished trial in one batch (one model fit), and asks it.  So a search rebuilt by
  :meth:`~r3tui.search.strategy.InnerSearch.resume` from the same trials asks exactly what the
  uninterrupted one would have, and no private attribute of skopt is touched.
- **Objective: log(median time).**  Failed trials (compile error, wrong result, crash, timeout)
  are told ``log(worst finite time) + log(penalty_factor)`` — a multiple of the worst time seen,
  recomputed from the whole history at every ask — and 0.0 while no trial has succeeded.
- **Initial design: quasi-random, valid.**  skopt's own initial phase samples the unconstrained
  space; here the design is drawn once with ``skopt.sampler`` (``sobol`` by default; ``lhs``,
  ``halton``, ``hammersly`` work too, the last two the same for every seed; ``grid`` raises
  ``MemoryError`` beyond a few dimensions and then falls back, like ``random``, to
  :meth:`SearchSpace.sample`), invalid and repeated points dropped, and is used until
  ``n_initial_points`` trials have finished.  Warm-start configs (a parent's best) come first
  and count toward it.
- **A child's prior.**  :meth:`~r3tui.search.strategy.InnerSearch.set_prior` gives a child
  variant's search its ancestors' trials.  The model is told those it has not evaluated
  itself, shifted per generation by the median log-time difference over shared configs (in a
  campaign the parent's best is asked first, so the shift is measured), and they count toward
  the initial design: a child with 5 trials spends them where the lineage's model points
  instead of on a fresh quasi-random design.  On the recorded hard nbody table a lineage of a
  12-trial search and four 5-trial children reached 0.901 of the optimum on mean over 10
  seeds without the prior and 0.9975 with it
  (``test_a_lineage_told_its_ancestors_trials_searches_like_one_long_search``).  A search
  told a prior runs other settings than a cold one: see "Two regimes" in
  :mod:`r3tui.search.bayes_settings`.
- **Valid proposals.**  :meth:`SearchSpace.is_valid_point` is passed as ``space_constraint``,
  so skopt samples acquisition candidates from valid points only (this forces
  ``acq_optimizer="sampling"``).  With ``constrain_sampling=False`` the optimizer sees the raw
  space, and each invalid point it proposes is told the failure penalty without being
  evaluated, counted in ``invalid_count`` and kept in the history.
- **Local candidates** (``local_candidates=N``, 3 by default, 0 when told a prior).  The valid
  neighbours of the ``N`` best told points are scored beside skopt's proposal, and the best new
  one is asked (:mod:`r3tui.search.local_candidates`).
- **Batches: constant liar.**  Pending trials and the points already chosen for this batch are
  told a lie (``cl_min``: the best value so far; ``cl_mean``, ``cl_max``) before the next point
  is asked, as ``Optimizer.ask(n_points=..., strategy=...)`` does, so a batch holds distinct
  points and the compile pool stays busy.
- **One hyperparameter search a batch** (``fit_per=auto``, the default; session 31).  skopt's
  ``Optimizer`` (``fit_per=point``) searches the GP's hyperparameters at every point it is
  told, lies included: 7.6 searches a batch of 8, 389 ms of CPU an evaluation at 100
  evaluations on these tables, more than a GPU needs to replay a candidate.  The batch model
  (:mod:`r3tui.search.surrogate`) searches them once an ask and tells the batch's later points
  their lies with the hyperparameters held.  ``auto`` searches them at every ask until
  ``batch_after`` (40) trials are finished, then only as the history grows by
  ``gp_search_growth``; ``batch`` grows from the initial design on, which lost the
  BO-beats-random test at 20 evaluations on hard sgemm (hyperparameters of 10 points held
  until 15).  ``auto`` passes it on every table; at batches of 8 over 10 seeds on the
  recorded tables its loss at 20 and 50 evaluations was within noise of ``point``'s (0.98%
  against 1.55% of the optimum, standard error of the difference 0.45) for 58 s of CPU
  against 510 s (bench/results/2026-12-06-search-auto-cpu.txt).
  A search told a prior (a campaign's child) still asks skopt's Optimizer until the model is
  told ``batch_after`` points: the lineage test needs it.  From ``batch_after`` trials on the
  hyperparameter search starts from skopt's initial kernel only (``gp_restarts_late``, 0;
  before it ``gp_restarts``, 2, as skopt): those searches are on more points and cost more,
  and without them the sweep at 100 and 200 evaluations took 110 s of CPU against 170 s, its
  loss within noise (bench/results/2026-12-06-search-restarts-cpu.txt); 0 restarts from the
  start lost the BO-beats-random test at 20 evaluations on hard sgemm.
- **Output transforms** (``transform``): what the model fits from the told log-times
  (:mod:`r3tui.search.output_transform`).
- **Acquisition.**  ``gp_hedge`` (skopt's portfolio of EI, LCB and PI) is, since each ask builds
  a fresh optimizer and its gains do not carry over, a seeded random choice among the three
  per ask; ``EI`` aims ``xi`` (0.01 in log time, about 1 %) past the best.
- **Settings.**  Every setting, what it may be, the two regimes' defaults (a cold search and
  one told a prior) with the sweeps that chose them, and the estimators that work are in
  :mod:`r3tui.search.bayes_settings`.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from r3tui.domain import TrialConfig
from r3tui.search.bayes_settings import GENERATORS, BayesSettings
from r3tui.search.local_candidates import best_local, neighbours
from r3tui.search.output_transform import normal_scores, transformed
from r3tui.search.space import SearchSpace, config_key
from r3tui.search.strategy import InnerSearch, TrialRecord, derive_seed

# The names importers know from when this module held the settings, transforms and neighbours.
__all__ = ["GENERATORS", "BayesSearch", "BayesSettings", "neighbours", "normal_scores",
           "transformed"]


@functools.cache
def _blas_threads() -> Any:
    """The process's thread pools (BLAS, OpenMP), found once: ``threadpool_limits`` looks
    for them again each time it is entered, reading the process's loaded libraries (2.7 ms
    on this 2-core machine, 6.5 ms while the compile pool works: a tenth of an ask).  Asked
    at the first ask, when numpy and scipy have loaded the libraries the model uses."""
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

    return ThreadpoolController()


class BayesSearch(InnerSearch):
    """Bayesian optimization over a :class:`SearchSpace` (ask/tell, no I/O)."""

    name = "bayes"

    def __init__(self, space: SearchSpace, seed: int = 0,
                 settings: BayesSettings | None = None) -> None:
        super().__init__(space, seed)
        self.settings = settings or BayesSettings()
        self.in_force = self.settings  # ``settings.with_prior()`` once told a usable prior
        self._design: list[list[Any]] | None = None
        self._points: dict[str, list[Any] | None] = {}
        self.fallbacks = 0  # model asks that repeated a known point, filled at random by us
        self.model_repeats = 0  # proposals skopt itself replaced by a random point
        self.design_fallback = False  # the generator failed; the design is uniform random
        self._optimizer_fits = 0  # tells to skopt's Optimizer (each searches hyperparameters)
        self._batch: Any = None  # fit_per=batch: its surrogate.BatchProposer, built once

    @property
    def model_fits(self) -> int:
        """Hyperparameter searches of the model so far (every tell to skopt's Optimizer is
        one; ``fit_per=batch``: at most one per ask)."""
        return self._optimizer_fits + (self._batch.searches if self._batch else 0)

    @property
    def lies_told(self) -> int:
        """``fit_per=batch``: lies told to a posterior (without a fit) so far."""
        return self._batch.lies_told if self._batch else 0

    def set_prior(self, groups: Iterable[Iterable[TrialRecord]]) -> int:
        usable = super().set_prior(groups)
        self.in_force = self.settings.with_prior() if usable else self.settings
        return usable

    # -- proposal ------------------------------------------------------------------------
    def _propose(self, n: int, taken: set[str]) -> list[TrialConfig]:
        out: list[TrialConfig] = []
        # Prior points (a parent's trials) count toward the design: the model already has data.
        in_design = self.n_evaluated + self.n_prior_points()
        if in_design < self.settings.n_initial_points:
            for point in self._initial_design():
                if len(out) >= n:
                    break
                config = self.space.to_config(point)
                key = config_key(config)
                if not self._known(key) and key not in taken:
                    out.append(config)
                    taken.add(key)
        if len(out) < n and in_design >= self.settings.n_initial_points:
            out.extend(self._from_model(n - len(out), taken))
        if len(out) < n:  # design used up before its results are in, or the model is stuck
            rng = random.Random(derive_seed(self.seed, "fill", len(self.history),
                                            len(self._pending), len(taken)))
            out.extend(self._fresh_random(n - len(out), taken, rng))
        return out

    def _initial_design(self) -> list[list[Any]]:
        if self._design is None:
            self._design = self._generate_design()
        return self._design

    def _generate_design(self) -> list[list[Any]]:
        """Quasi-random valid points: the first ``n_initial_points`` are asked before the model,
        the rest while their results are not in yet."""
        generator = self.settings.initial_point_generator
        want = 2 * self.settings.n_initial_points
        rng_seed = derive_seed(self.seed, "design")
        raw: list[Any] = []
        if self.space.dims and generator != "random":
            from skopt import sampler

            make = {"sobol": sampler.Sobol, "lhs": sampler.Lhs, "halton": sampler.Halton,
                    "hammersly": sampler.Hammersly, "grid": sampler.Grid}[generator]
            # Oversampled (invalid points are dropped); Sobol balances in powers of two, and
            # maximin LHS costs O(count^2) per iteration.
            count = 2 ** math.ceil(math.log2(max(64, 8 * want)))
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    raw = make().generate(self.space.dimensions(), count, random_state=rng_seed)
            except (MemoryError, ValueError):
                raw = []  # Grid refuses spaces of many dimensions ("Too large sets")
                self.design_fallback = True
        design: list[list[Any]] = []
        keys: set[str] = set()
        if len(raw) < want:  # random, or a generator that gave too few points
            raw = [*raw, *self.space.sample(random.Random(rng_seed), want)]
        for item in raw:
            point = self.space.normalize(item)
            if point is None or not self.space.is_valid_point(point):
                continue
            key = self.space.key(point)
            if key not in keys:
                keys.add(key)
                design.append(point)
        return design

    def _point_of(self, config: TrialConfig, key: str | None = None) -> list[Any] | None:
        key = config_key(config) if key is None else key
        if key not in self._points:
            indices = self.space.from_config(config)
            if indices is None and not self.settings.constrain_sampling:
                indices = self.space.unchecked_point(config)
            self._points[key] = indices
        return self._points[key]

    def _penalty(self, log_times: Iterable[float]) -> float:
        """What a failure is told: the worst log(time) plus log(penalty_factor); 0.0 while
        there is none."""
        finite = list(log_times)
        return (max(finite) + math.log(self.settings.penalty_factor)) if finite else 0.0

    def objective(self, records: Sequence[TrialRecord]) -> list[float]:
        """What the optimizer is told for each record: log(time), or the failure penalty."""
        penalty = self._penalty(math.log(r.time_s) for r in records if r.ok and r.time_s)
        return [math.log(r.time_s) if r.ok and r.time_s else penalty for r in records]

    def _told(self, upto: int | None = None) -> tuple[list[list[Any]], list[float], float]:
        """Every point the model is told, its value, and the failure penalty used; with
        ``upto``, as if only the first ``upto`` trials of the history were finished and none
        pending (what ``fit_per=batch`` searches hyperparameters on, the same after a resume).

        Own trials first; then the prior's (see :meth:`InnerSearch.set_prior`) that this search
        has not evaluated itself.  Each prior group is moved onto this search's scale by the
        median difference of log(time) over the configs it shares with what is already told
        (own trials, then nearer groups), or left as it is when it shares none; so a child's
        model sees its parent's landscape at the level the child measured at the parent's best.
        Prior failures are told the penalty, like own ones."""
        history = self.history if upto is None else self.history[:upto]
        own = [(p, r) for r in history if (p := self._point_of(r.config, r.key)) is not None]
        scale = {r.key: math.log(r.time_s) for _, r in own if r.ok and r.time_s}
        extra: list[tuple[list[Any], float | None]] = []
        taken = {r.key for _, r in own} | (set(self._pending) if upto is None else set())
        for group in self.prior:
            logs = {r.key: math.log(r.time_s) for r in group if r.ok and r.time_s}
            shared = [scale[k] - v for k, v in logs.items() if k in scale]
            shift = statistics.median(shared) if shared else 0.0
            for record in group:
                point = self.space.from_config(record.config)
                if record.key in taken or point is None:
                    continue
                taken.add(record.key)
                value = logs[record.key] + shift if record.key in logs else None
                if value is not None:
                    scale[record.key] = value
                extra.append((point, value))
        penalty = self._penalty(scale.values())
        points = [p for p, _ in own] + [p for p, _ in extra]
        values = [math.log(r.time_s) if r.ok and r.time_s else penalty for _, r in own]
        values += [penalty if v is None else v for _, v in extra]
        return points, values, penalty

    def n_prior_points(self) -> int:
        """Prior points the model is told now (not evaluated here, points of this space): the
        ``extra`` of :meth:`_told`, counted without computing their values."""
        own = {r.key for r in self.history} | set(self._pending)
        return len({r.key for group in self.prior for r in group
                    if r.key not in own and self.space.from_config(r.config) is not None})

    def _optimizer(self) -> Any:
        from skopt import Optimizer

        s = self.in_force
        return Optimizer(
            self.space.dimensions(),
            base_estimator=s.estimator,
            n_initial_points=0,  # the design is ours; the model is used from the first tell
            acq_func=s.acq_func,
            acq_func_kwargs={"xi": s.xi, "kappa": s.kappa},
            acq_optimizer="sampling",
            acq_optimizer_kwargs={"n_points": s.n_candidates},
            space_constraint=self.space.is_valid_point if s.constrain_sampling else None,
            random_state=derive_seed(self.seed, "model", len(self.history), len(self._pending)),
        )

    def _from_model(self, n: int, taken: set[str]) -> list[TrialConfig]:
        # The model's matrices are tiny: BLAS threads only contend with the compile pool
        # (a Gaussian-process fit took 10x longer with both cores busy).
        s = self.in_force
        with _blas_threads().limit(limits=1):
            # auto: a child told its ancestors' trials asks skopt's Optimizer until the model
            # is told batch_after points (the lineage test: 0.948 of the optimum with the
            # batch model there, against 0.99 or more); any other search the batch model
            prior = self.n_prior_points()
            early_child = prior > 0 and self.n_evaluated + prior < s.batch_after
            batch = s.fit_per == "batch" or (s.fit_per == "auto" and not early_child)
            if batch and s.estimator == "GP" and s.constrain_sampling:
                return self._ask_batch(n, taken)
            return self._ask_model(n, taken)

    def _ask_model(self, n: int, taken: set[str]) -> list[TrialConfig]:
        points, values, penalty = self._told()
        values = transformed(values, self.in_force.transform)
        if not points or not self.space.dims:
            return []
        lie = self._lie(values)
        for config in [*self._pending.values()]:
            point = self._point_of(config)
            if point is not None:
                points.append(point)
                values.append(lie)
        out: list[TrialConfig] = []
        with warnings.catch_warnings(record=True) as caught:
            # skopt warns when its proposal repeats a told point and then picks a random one.
            warnings.simplefilter("always")
            opt = self._optimizer()
            opt.tell(points, values)
            self._optimizer_fits += 1
            attempts = 0
            while len(out) < n and attempts < 4 * n + 8:
                attempts += 1
                point = self.space.normalize(opt.ask())
                if point is None:
                    break
                if not self.space.is_valid_point(point):
                    config = self.space.to_config(point)
                    self._record(TrialRecord(config, None, None, "; ".join(
                        self.space.violations(point))))
                    self._points[config_key(config)] = point
                    opt.tell(point, penalty)
                    self._optimizer_fits += 1
                    continue
                if self.in_force.local_candidates:
                    local = best_local(opt, self.space, point, self.in_force,
                                       lambda p: self._is_new(p, taken))
                    point = point if local is None else local
                config = self.space.to_config(point)
                key = config_key(config)
                if self._known(key) or key in taken:
                    self.fallbacks += 1
                    break  # the model is stuck on known points; the caller fills at random
                out.append(config)
                taken.add(key)
                if len(out) < n:
                    opt.tell(point, lie)
                    self._optimizer_fits += 1
        self.model_repeats += sum("has been evaluated at point" in str(w.message)
                                  for w in caught)
        return out

    def _is_new(self, point: list[Any], taken: set[str]) -> bool:
        """Whether ``point`` is neither known to this search (finished or pending) nor ``taken``
        by this ask."""
        key = self.space.key(point)
        return not self._known(key) and key not in taken

    def _lie(self, values: Sequence[float]) -> float:
        """What a pending point or an earlier point of the batch is told (constant liar)."""
        strategy = self.settings.batch_strategy
        return min(values) if strategy == "cl_min" else (
            max(values) if strategy == "cl_max" else sum(values) / len(values))

    def _ask_batch(self, n: int, taken: set[str]) -> list[TrialConfig]:
        """``fit_per=batch``: see :class:`~r3tui.search.surrogate.BatchProposer`."""
        from r3tui.search import surrogate

        s = self.in_force
        points, values, _ = self._told()
        values = transformed(values, s.transform)
        if not points or not self.space.dims:
            return []
        if self._batch is None:
            self._batch = surrogate.BatchProposer(self.space, neighbours)
        # auto: the hyperparameters searched at every ask until batch_after trials are
        # finished (one search a batch, where skopt's Optimizer searches at every lie), then
        # only as the history grows; batch: from the initial design on, as it grows
        first = s.batch_after if s.fit_per == "auto" else s.n_initial_points
        checkpoint = surrogate.checkpoint(len(self.history), first, s.gp_search_growth)

        def told_at_checkpoint() -> tuple[list[list[Any]], list[float]]:
            at, told, _ = self._told(upto=checkpoint)
            return at, transformed(told, s.transform)

        restarts = s.gp_restarts if checkpoint < s.batch_after else s.gp_restarts_late
        hyper = self._batch.hyperparameters(checkpoint, told_at_checkpoint,
                                            derive_seed(self.seed, "model", checkpoint),
                                            restarts)
        lie = self._lie(values)
        pending = [p for k, c in self._pending.items() if (p := self._point_of(c, k)) is not None]
        step = (len(self.history), len(self._pending))
        plan = surrogate.Plan(s.acq_func, s.xi, s.kappa, s.n_candidates, s.local_candidates,
                              derive_seed(self.seed, "candidates", *step),
                              derive_seed(self.seed, "hedge", *step))

        out: list[TrialConfig] = []
        for point in self._batch.propose(points + pending, values + [lie] * len(pending), lie,
                                         hyper, plan, lambda p: self._is_new(p, taken)):
            config = self.space.to_config(point)
            out.append(config)
            taken.add(config_key(config))
            if len(out) == n:
                break
        if len(out) < n:
            self.fallbacks += 1  # every candidate is known; the caller fills at random
        return out
