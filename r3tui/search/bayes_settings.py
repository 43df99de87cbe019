"""The settings of a Bayesian search (:class:`BayesSettings`), what each may be, and why the
defaults are what they are.

:class:`~r3tui.search.bayes.BayesSearch` reads them; how it uses each is told in
:mod:`r3tui.search.bayes`, the output transforms in :mod:`r3tui.search.output_transform`.

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
  refused with a :class:`~r3tui.errors.ConfigError`; :class:`~r3tui.search.strategy.RandomSearch`
  replaces ``dummy``.  (``Space.rvs`` itself works: skopt's random initial points and
  duplicate fallback use it.)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from r3tui.errors import ConfigError
from r3tui.search.output_transform import TRANSFORMS

ESTIMATORS = ("GP", "RF", "ET")
BROKEN_ESTIMATORS = {
    "GBRT": "skopt's GradientBoostingQuantileRegressor is not a regressor to scikit-learn 1.9",
    "DUMMY": "skopt's dummy estimator (None) fails scikit-learn 1.9's estimator-tag check",
}
GENERATORS = ("sobol", "lhs", "halton", "hammersly", "grid", "random")
ACQ_FUNCS = ("gp_hedge", "EI", "LCB", "PI")
BATCH_STRATEGIES = ("cl_min", "cl_mean", "cl_max")
FIT_PER = ("point", "batch", "auto")


@dataclass(frozen=True)
class BayesSettings:
    """How :class:`~r3tui.search.bayes.BayesSearch` drives scikit-optimize."""

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
                                 "(r3tui.search.surrogate), searched again as the history "
                                 "grows by gp_search_growth; auto: batch, searched at every ask "
                                 "until batch_after trials are finished (a search told a prior: "
                                 "point until the model is told batch_after points); RF, ET and "
                                 "constrain_sampling=false always run point"})
    batch_after: int = field(
        default=40, metadata={"help": "fit_per=auto: finished trials until which the "
                              "hyperparameters are searched at every ask (once a batch)"})
    gp_restarts: int = field(
        default=2, metadata={"help": "fit_per=batch/auto: random restarts of the GP's "
                             "hyperparameter search besides the start at skopt's initial "
                             "kernel (skopt's GP: 2), while fewer than batch_after trials are "
                             "finished"})
    gp_restarts_late: int = field(
        default=0, metadata={"help": "fit_per=batch/auto: the same once batch_after trials are "
                             "finished, where each search costs more (0: a loss within noise of "
                             "2's at 100-200 evaluations, 110 s of CPU against 170 s: "
                             "bench/results/2026-12-06-search-restarts-cpu.txt)"})
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
        if self.gp_restarts < 0 or self.gp_restarts_late < 0:
            raise ConfigError("gp_restarts and gp_restarts_late must be at least 0")
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
