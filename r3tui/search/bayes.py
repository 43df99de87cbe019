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
  told a prior runs other settings than a cold one: see "Two regimes" below.
- **Valid proposals.**  :meth:`SearchSpace.is_valid_point` is passed as ``space_constraint``,
  so skopt samples acquisition candidates from valid points only (this forces
  ``acq_optimizer="sampling"``).  With ``constrain_sampling=False`` the optimizer sees the raw
  space, and each invalid point it proposes is told the failure penalty without being
  evaluated, counted in ``invalid_count`` and kept in the history.
- **Local candidates** (``local_candidates=N``, 3 by default, 0 when told a prior).  skopt
  scores the acquisition function on ``n_candidates`` uniformly random valid points; with
  ``N > 0`` the valid neighbours (:func:`neighbours`: one step in one or two dimensions) of the
  ``N`` best told points (pending lies included) are scored too, with the model of the same tell
  (``opt.models[-1]``, ``skopt.acquisition.gaussian_ei`` and friends), and the best new point
  of skopt's proposal and those neighbours is asked.  Deterministic: ties go to skopt's
  proposal, then to the neighbours' fixed order.  On these tables (1470-2040 valid configs)
  the 2000 random candidates already hold about 2/3 of the space, yet a neighbour won 20-41 %
  of the model's asks (two seeds, 50 evaluations, hard tables and stencil7).
- **Batches: constant liar.**  Pending trials and the points already chosen for this batch are
  told a lie (``cl_min``: the best value so far; ``cl_mean``, ``cl_max``) before the next point
  is asked, as ``Optimizer.ask(n_points=..., strategy=...)`` does, so a batch holds distinct
  points and the compile pool stays busy.
- **One hyperparameter search a batch, past 40 points** (``fit_per=auto``, the default since
  session 24).  skopt's ``Optimizer`` searches the GP's hyperparameters at every point it is
  told, lies included: 7.6 searches a batch of 8, 389 ms of CPU an evaluation at 100
  evaluations on these tables, more than a GPU needs to replay a candidate.  ``fit_per=batch``
  (:mod:`r3tui.search.surrogate`) searches them once a batch and tells the batch's later
  points their lies with the hyperparameters held.  Over five seeds on the nine tables its
  loss was within noise of the Optimizer's at 30 and at 100 evaluations, at 0.06x the CPU at
  100, but with it the BO-beats-random test at 20 evaluations failed on hard sgemm; so
  ``auto`` asks what ``point`` asks until the model is told ``batch_after`` points (own and
  prior) and batches from there (bench/results/2026-12-05-search-cost-cpu.txt).
- **Output transforms** (``transform``).  ``log`` tells the model log(time); ``rank`` the
  normal scores of the told values' ranks (:func:`normal_scores`); ``power`` a Yeo-Johnson
  transform of the log-times fitted at each ask (scikit-learn's ``PowerTransformer``), so the
  slow tail (``-O0``, tiny blocks, failures) weighs less in the fit; ``cap`` and ``mixed`` see
  ``BayesSettings.transform``.
- **Acquisition.**  ``gp_hedge`` (skopt's portfolio of EI, LCB and PI) is, since each ask builds
  a fresh optimizer and its gains do not carry over, a seeded random choice among the three
  per ask; ``EI`` aims ``xi`` (0.01 in log time, about 1 %) past the best.
- **Two regimes, two defaults.**  A cold search (``r3 tune --inner-only``, a campaign's
  original source) runs ``acq_func=gp_hedge, transform=power, local_candidates=3``; a search
  told a usable prior (a campaign child) switches to ``prior_acq_func=EI, prior_transform=log,
  prior_local_candidates=0`` (:meth:`BayesSettings.with_prior`, ``in_force``).  Both chosen in
  simulation on the nine recorded H200 tables (``bench/inner_bo.py``), ranked by the mean over
  every run of 100*log(best / optimum) ("loss"):

  - *Cold.*  EI on log time was the default through session 15 (first of 17 settings on seeds
    0-9 in session 12, ``bench/results/2026-12-03-inner-bo-settings-sweep.txt``; no other GP
    setting whose design varies with the seed did measurably better over seeds 0-29).  Its
    weak cell was hard sgemm at 20 evaluations, where its median tied random search's (0.02 %
    behind on seeds 0-9).  Session 15 found gp_hedge + power + 3 local candidates
    (``bench/results/2026-12-03-inner-bo-s15.txt``; loss 0.786 against 1.000 over seeds 0-29,
    partly picked on seeds 20-29).  Session 16 checked it on seeds 30-49, never run before,
    under a rule written down first (``bench/results/2026-12-03-inner-bo-s16.txt``): loss 0.826
    against 1.238 (paired difference -0.412, standard error 0.175), at or above random's median
    in 16 and 15 of 16 cells on seeds 30-39 and 40-49, against 15 and 13.  Over seeds 0-49:
    0.802 against 1.095, 16 of 16 cells, hard sgemm at 20 0.9937 against random's 0.9927.
    ``power`` alone or with gp_hedge hurt hard nbody (runs stuck in its ``-O1`` + fast-math
    local optimum, 0.76 of the optimum); the local candidates took that away.
  - *Told a prior.*  A campaign lineage on hard nbody (a 12-trial search, then four 5-trial
    children told their ancestors' trials; the lineage test in
    ``tests/unit/test_search_simulation.py``) reaches 0.999 of the optimum on mean over seeds
    0-9 with EI on log time everywhere, 0.930 with the cold setting everywhere; with the cold
    setting at the root and, in the children, EI on log time 0.9975, or one part of the cold
    setting 0.948 (power), 0.970 (gp_hedge), 0.952 (3 local candidates): with each part some
    lineages end in hard nbody's ``-O1`` local optimum (0.76 of the optimum).

  Not the default, in those sweeps: ``halton`` (better only because skopt's ``Halton`` ignores
  the seed: every seed starts from the same ten points, good on these tables), LCB, PI, other
  ``xi``, 5/8/15 initial points, LHS or random designs, 5000 candidates, ``rank``, ``cap``,
  ``mixed``; RF and ET (ET leads on hard sgemm at 20 but stays near random on hard nbody).
- **Estimators.**  ``GP`` (default), ``RF`` and ``ET`` work.  ``GBRT`` and ``dummy`` fail
  inside ``Optimizer.__init__`` on this scikit-learn (``is_regressor`` rejects skopt's
  ``GradientBoostingQuantileRegressor``; ``None`` has no ``__sklearn_tags__``), so they are
  refused with a :class:`~r3tui.errors.ConfigError`; :class:`RandomSearch` replaces ``dummy``.
  (``Space.rvs`` itself works: skopt's random initial points and duplicate fallback use it.)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from r3tui.domain import TrialConfig
from r3tui.errors import ConfigError
from r3tui.search.space import SearchSpace, config_key
from r3tui.search.strategy import InnerSearch, TrialRecord, derive_seed

ESTIMATORS = ("GP", "RF", "ET")
BROKEN_ESTIMATORS = {
    "GBRT": "skopt's GradientBoostingQuantileRegressor is not a regressor to scikit-learn 1.9",
    "DUMMY": "skopt's dummy estimator (None) fails scikit-learn 1.9's estimator-tag check",
}
GENERATORS = ("sobol", "lhs", "halton", "hammersly", "grid", "random")
ACQ_FUNCS = ("gp_hedge", "EI", "LCB", "PI")
BATCH_STRATEGIES = ("cl_min", "cl_mean", "cl_max")


TRANSFORMS = ("log", "rank", "power", "cap", "mixed")
FIT_PER = ("point", "batch", "auto")


def normal_scores(values: Sequence[float]) -> list[float]:
    """Each value's rank (ties share their mean rank) as a standard normal quantile.  (scipy
    and scikit-learn come with scikit-optimize.)"""
    from scipy.stats import norm, rankdata  # type: ignore[import-untyped]

    return [float(q) for q in norm.ppf((rankdata(values) - 0.5) / len(values))] if values else []


def transformed(values: list[float], transform: str) -> list[float]:
    """What the model fits, from the told log-times: see ``BayesSettings.transform``."""
    if transform == "rank":
        return normal_scores(values)
    if transform == "mixed":
        # A portfolio of two fits: power on an even number of told values, log on an odd one.
        transform = "power" if len(values) % 2 == 0 else "log"
    if transform == "cap":
        # Winsorized from above: every value past the told median counts as the median, so
        # the slow tail (ptxas -O0, tiny blocks) stops dominating the fit.
        ceiling = statistics.median(values)
        return [min(v, ceiling) for v in values]
    if transform == "power" and len(set(values)) > 2:
        from sklearn.preprocessing import PowerTransformer  # type: ignore[import-untyped]

        low = min(values)
        fitted = PowerTransformer(method="yeo-johnson").fit_transform([[v - low] for v in values])
        return [float(row[0]) for row in fitted]
    return values


@dataclass(frozen=True)
class BayesSettings:
    """How :class:`BayesSearch` drives scikit-optimize."""

    estimator: str = field(default="GP", metadata={"help": "surrogate model: GP, RF or ET"})
    n_initial_points: int = field(
        default=10, metadata={"help": "finished trials (warm starts included) before the model"})
    initial_point_generator: str = field(
        default="sobol", metadata={"help": "sobol, lhs, halton, hammersly, grid or random"})
    acq_func: str = field(default="gp_hedge", metadata={"help": "gp_hedge, EI, LCB or PI"})
    xi: float = field(
        default=0.01, metadata={"help": "EI/PI: improvement over the best log(time) to aim past"})
    kappa: float = field(
        default=1.96, metadata={"help": "LCB: weight of the model's uncertainty"})
    n_candidates: int = field(
        default=2000, metadata={"help": "valid points the acquisition function is sampled on"})
    batch_strategy: str = field(
        default="cl_min", metadata={"help": "constant-liar lie for batched asks"})
    penalty_factor: float = field(
        default=2.0, metadata={"help": "a failed trial counts as this multiple of the worst time"})
    constrain_sampling: bool = field(
        default=True, metadata={"help": "sample acquisition candidates from valid points only"})
    transform: str = field(
        default="power", metadata={"help": "what the model fits: log (log time), rank (normal "
                                 "scores of the ranks), power (Yeo-Johnson of log time) or "
                                 "cap (log time, capped at the told median); mixed: power "
                                 "and log by turns"})
    local_candidates: int = field(
        default=3, metadata={"help": "the best N told points' valid neighbours (one step in one "
                             "or two dimensions) join the acquisition candidates; 0: off"})
    fit_per: str = field(
        default="auto", metadata={"help": "point: skopt's Optimizer, its GP refitted with a "
                                 "hyperparameter search for every point of a batch; batch: one "
                                 "hyperparameter search per batch, the batch's later points "
                                 "told their lie with the hyperparameters fixed "
                                 "(r3tui.search.surrogate); auto: point until the model is told "
                                 "batch_after points, batch from then on; RF, ET and "
                                 "constrain_sampling=false always run point"})
    batch_after: int = field(
        default=40, metadata={"help": "fit_per=auto: the points told the model (own trials and "
                              "a prior's) from which a batch costs one hyperparameter search"})
    gp_restarts: int = field(
        default=2, metadata={"help": "fit_per=batch: random restarts of the GP's hyperparameter "
                             "search (skopt's GP: 2)"})
    gp_search_growth: float = field(
        default=1.5, metadata={"help": "fit_per=batch: the GP's hyperparameters are searched "
                               "again once the history has grown by this factor (1: at every "
                               "ask); in between they are held and only the posterior is "
                               "recomputed"})
    prior_acq_func: str = field(
        default="EI", metadata={"help": "acq_func of a search told a prior (a campaign "
                                "child told its ancestors' trials)"})
    prior_transform: str = field(
        default="log", metadata={"help": "transform of a search told a prior"})
    prior_local_candidates: int = field(
        default=0, metadata={"help": "local_candidates of a search told a prior"})

    def __post_init__(self) -> None:
        if self.estimator.upper() in BROKEN_ESTIMATORS:
            raise ConfigError(f"estimator {self.estimator} does not work here: "
                              f"{BROKEN_ESTIMATORS[self.estimator.upper()]}",
                              hint=f"use one of {', '.join(ESTIMATORS)}, or RandomSearch")
        checks = (("estimator", self.estimator, ESTIMATORS),
                  ("initial_point_generator", self.initial_point_generator, GENERATORS),
                  ("acq_func", self.acq_func, ACQ_FUNCS),
                  ("prior_acq_func", self.prior_acq_func, ACQ_FUNCS),
                  ("batch_strategy", self.batch_strategy, BATCH_STRATEGIES))
        for name, value, allowed in checks:
            if value not in allowed:
                raise ConfigError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        if self.n_initial_points < 1 or self.n_candidates < 1:
            raise ConfigError("n_initial_points and n_candidates must be at least 1")
        for name, value in (("transform", self.transform),
                            ("prior_transform", self.prior_transform)):
            if value not in TRANSFORMS:
                raise ConfigError(f"{name} {value!r} is not one of {', '.join(TRANSFORMS)}")
        if self.fit_per not in FIT_PER:
            raise ConfigError(f"fit_per {self.fit_per!r} is not one of {', '.join(FIT_PER)}")
        if self.batch_after < 1:
            raise ConfigError("batch_after must be at least 1")
        if self.gp_restarts < 0:
            raise ConfigError("gp_restarts must be at least 0")
        if not (math.isfinite(self.gp_search_growth) and self.gp_search_growth >= 1.0):
            raise ConfigError("gp_search_growth must be at least 1")
        if self.local_candidates < 0 or self.prior_local_candidates < 0:
            raise ConfigError("local_candidates and prior_local_candidates must be at least 0")
        if not self.penalty_factor >= 1.0:
            raise ConfigError("penalty_factor must be at least 1")
        if not (math.isfinite(self.xi) and self.xi >= 0.0
                and math.isfinite(self.kappa) and self.kappa >= 0.0):
            raise ConfigError("xi and kappa must be finite and at least 0")

    @classmethod
    def parse(cls, spec: str, **base: Any) -> BayesSettings:
        """``defaults`` or ``NAME=VALUE,NAME=VALUE`` over these fields (``r3 tune --bo``,
        ``bench/inner_bo.py --set``), on top of ``base``; a bad spec raises ``ConfigError``."""
        kinds = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        values: dict[str, Any] = dict(base)
        for item in ([] if spec.strip() in ("", "defaults") else spec.split(",")):
            name, _, text = item.partition("=")
            name, text = name.strip(), text.strip()
            if name not in kinds or not text:
                raise ConfigError(f"bad Bayesian search setting {item!r}: want NAME=VALUE",
                                  hint=f"NAME is one of {', '.join(kinds)}")
            kind = kinds[name]
            try:
                values[name] = (int(text) if kind == "int" else float(text) if kind == "float"
                                else _flag(text) if kind == "bool" else text)
            except ValueError:
                raise ConfigError(f"bad Bayesian search setting {item!r}: {name} is "
                                  f"{kind}") from None
        return cls(**values)

    def changed(self) -> str:
        """The fields that differ from the defaults, as a spec (``defaults`` when none)."""
        default = BayesSettings()
        items = [f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) != getattr(default, f.name)]
        return ",".join(items) or "defaults"

    def with_prior(self) -> BayesSettings:
        """The settings in force once a search is told a prior: the ``prior_*`` fields in
        place of ``acq_func``, ``transform`` and ``local_candidates``."""
        return dataclasses.replace(self, acq_func=self.prior_acq_func,
                                   transform=self.prior_transform,
                                   local_candidates=self.prior_local_candidates)


def _flag(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


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

    def _point_of(self, config: TrialConfig) -> list[Any] | None:
        key = config_key(config)
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
        own = [(p, r) for r in history if (p := self._point_of(r.config)) is not None]
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
        from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

        # The model's matrices are tiny: BLAS threads only contend with the compile pool
        # (a Gaussian-process fit took 10x longer with both cores busy).
        s = self.in_force
        with threadpool_limits(limits=1):
            told = self.n_evaluated + self.n_prior_points()
            batch = s.fit_per == "batch" or (s.fit_per == "auto" and told >= s.batch_after)
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
                    local = self._best_local(opt, point, taken)
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
        checkpoint = surrogate.checkpoint(len(self.history), s.n_initial_points,
                                          s.gp_search_growth)

        def told_at_checkpoint() -> tuple[list[list[Any]], list[float]]:
            at, told, _ = self._told(upto=checkpoint)
            return at, transformed(told, s.transform)

        hyper = self._batch.hyperparameters(checkpoint, told_at_checkpoint,
                                            derive_seed(self.seed, "model", checkpoint),
                                            s.gp_restarts)
        lie = self._lie(values)
        pending = [p for c in self._pending.values() if (p := self._point_of(c)) is not None]
        step = (len(self.history), len(self._pending))
        plan = surrogate.Plan(s.acq_func, s.xi, s.kappa, s.n_candidates, s.local_candidates,
                              derive_seed(self.seed, "candidates", *step),
                              derive_seed(self.seed, "hedge", *step))

        def is_new(point: list[Any]) -> bool:
            key = self.space.key(point)
            return not self._known(key) and key not in taken

        out: list[TrialConfig] = []
        for point in self._batch.propose(points + pending, values + [lie] * len(pending), lie,
                                         hyper, plan, is_new):
            config = self.space.to_config(point)
            out.append(config)
            taken.add(config_key(config))
            if len(out) == n:
                break
        if len(out) < n:
            self.fallbacks += 1  # every candidate is known; the caller fills at random
        return out

    def _best_local(self, opt: Any, proposal: list[Any], taken: set[str]) -> list[Any] | None:
        """The candidate with the best acquisition value among skopt's ``proposal`` (its best
        of ``n_candidates`` random valid points) and the neighbours of the best
        ``local_candidates`` points the optimizer has been told (pending lies included), or
        None when none of them is new.  Ties go to ``proposal``, then to the neighbours' order,
        so the choice is deterministic."""
        import numpy as np

        told = {tuple(x) for x in opt.Xi}
        order = sorted(range(len(opt.yi)), key=lambda i: (opt.yi[i], i))
        candidates = [proposal] if tuple(proposal) not in told else []
        seen = {tuple(proposal)} | told
        for i in order[:self.in_force.local_candidates]:
            for move in neighbours(self.space, opt.Xi[i]):
                if tuple(move) not in seen:
                    seen.add(tuple(move))
                    candidates.append(move)
        if not candidates:
            return None
        scores = self._acquisition(opt, np.asarray(opt.space.transform(candidates)))
        for i in np.argsort(scores, kind="stable"):
            point = candidates[int(i)]
            key = self.space.key(point)
            if not self._known(key) and key not in taken:
                return point
        return None

    def _acquisition(self, opt: Any, x: Any) -> Any:
        """skopt's acquisition values at transformed points ``x`` (lower is better), with the
        model of the last tell; ``gp_hedge`` is scored with EI (its choice per ask is not
        public)."""
        import numpy as np
        from skopt.acquisition import gaussian_ei, gaussian_lcb, gaussian_pi

        model, s = opt.models[-1], self.in_force
        if s.acq_func == "LCB":
            return np.asarray(gaussian_lcb(x, model, kappa=s.kappa))
        gain = gaussian_pi if s.acq_func == "PI" else gaussian_ei
        return -np.asarray(gain(x, model, y_opt=float(np.min(opt.yi)), xi=s.xi))


def neighbours(space: SearchSpace, point: Sequence[Any]) -> list[list[Any]]:
    """The valid points one step from ``point`` in one dimension, then in two: an ordinal
    dimension moves to the next index up or down, a categorical one to each other label.
    Distinct, ``point`` itself excluded, in a fixed order."""
    here = space.normalize(point)
    if here is None:
        return []
    moves: list[list[Any]] = []
    for j, dim in enumerate(space.dims):
        if dim.ordinal:
            moves.append([v for v in (here[j] - 1, here[j] + 1) if 0 <= v < len(dim.choices)])
        else:
            moves.append([label for label in dim.labels if label != here[j]])
    out: list[list[Any]] = []
    for j, values in enumerate(moves):
        for value in values:
            out.append([*here[:j], value, *here[j + 1:]])
    for j, k in itertools.combinations(range(len(moves)), 2):
        for a, b in itertools.product(moves[j], moves[k]):
            moved = list(here)
            moved[j], moved[k] = a, b
            out.append(moved)
    return [p for p in out if space.is_valid_point(p)]
