"""The Gaussian-process batch model of :class:`~r3tui.search.bayes.BayesSearch` (``fit_per=batch``).

skopt's ``Optimizer`` refits its model, hyperparameter search included, at every ``tell``, and
draws its acquisition candidates at every fit by rejection sampling through the
``space_constraint`` predicate (one Python call per drawn point).  Asking a batch of 8 with a
constant liar therefore costs 8 hyperparameter searches and 8 samplings of ``n_candidates``
valid points; on the recorded tables that is 50-600 ms of CPU per evaluation.  Here the same
parts of scikit-optimize are driven directly, through its public API only:

- the model is the one ``Optimizer`` builds for ``base_estimator="GP"``
  (``skopt.utils.cook_estimator``: a constant times a Matern-5/2 kernel with one length scale
  per transformed dimension, a fitted white-noise term, ``normalize_y``), fitted to the points
  as ``skopt.space.Space(normalize_dimensions(...)).transform`` encodes them;
- its hyperparameters are searched as that model's own ``fit`` searches them (:func:`fit_gp`;
  :func:`search_hyperparameters` runs the same searches on a numpy likelihood), at most once
  per batch; with them fixed, :class:`Posterior` computes the posterior as skopt's GP does,
  and each later point of the batch is told its lie by appending a row to the posterior's
  Cholesky factor instead of a new fit, as batch Bayesian optimization usually does;
- the acquisition values are skopt's formulas (:func:`acquisition`: ``gaussian_ei``, ``_pi``,
  ``_lcb``) on that posterior's mean and deviation;
- candidates are drawn uniformly from the valid points by :class:`EncodedSpace` without
  rejection (one valid combination per group of tied dimensions, numpy), and encoded by table
  look-up, so drawing and encoding 2000 of them costs well under a millisecond.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import cholesky, solve_triangular  # type: ignore[import-untyped]

from r3tui.search.space import SearchSpace

ACQUISITIONS = ("EI", "LCB", "PI")  # gp_hedge's portfolio, as skopt's


class EncodedSpace:
    """A :class:`SearchSpace`'s points as rows of choice indices, encoded as skopt encodes them
    for a Gaussian process (``normalize`` for integer dimensions, ``onehot`` for categorical
    ones), and uniform draws of valid points."""

    def __init__(self, space: SearchSpace) -> None:
        from skopt.space import Space
        from skopt.utils import normalize_dimensions

        self.space = space
        self.dimensions = space.dimensions()
        encoded = Space(normalize_dimensions(space.dimensions()))
        # skopt's GP takes a Hamming kernel where every dimension is categorical
        self.categorical = bool(encoded.is_categorical)
        self.columns: list[np.ndarray] = []
        for dim, skopt_dim in zip(space.dims, encoded.dimensions, strict=True):
            values: list[Any] = (list(range(len(dim.choices))) if dim.ordinal
                                 else list(dim.labels))
            table = np.asarray(skopt_dim.transform(values), dtype=float)
            self.columns.append(table.reshape(len(values), -1))
        groups = space.valid_groups()
        self.groups = None if groups is None else [
            (list(members), np.asarray(valid, dtype=np.intp).reshape(len(valid), len(members)))
            for members, valid in groups]

    def row(self, point: Sequence[Any]) -> tuple[int, ...]:
        indices = self.space.indices(point)
        if indices is None:
            raise ValueError(f"{list(point)!r} is not a point of the space")
        return indices

    def encode(self, rows: np.ndarray) -> np.ndarray:
        """Index rows (n x dims) as the model's inputs (n x transformed dims)."""
        rows = np.asarray(rows, dtype=np.intp).reshape(-1, len(self.columns))
        return np.hstack([table[rows[:, j]] for j, table in enumerate(self.columns)])

    def sample(self, seed: int, n: int) -> np.ndarray:
        """``n`` valid points drawn uniformly (with replacement, as skopt's sampler), as index
        rows."""
        rows = np.zeros((n, len(self.columns)), dtype=np.intp)
        if self.groups is None:  # a group too large to list: rejection, as SearchSpace.sample
            drawn = self.space.sample(random.Random(seed), n)
            return np.asarray([self.row(p) for p in drawn], dtype=np.intp).reshape(n, -1)
        rng = np.random.default_rng(seed)
        for members, valid in self.groups:
            rows[:, members] = valid[rng.integers(len(valid), size=n)]
        return rows


def fit_gp(space: EncodedSpace, x: np.ndarray, y: Sequence[float], seed: int,
           restarts: int) -> Any:
    """skopt's default GP for ``space`` (the one ``Optimizer`` builds for ``"GP"``), its
    hyperparameters searched on encoded points ``x``: from skopt's initial kernel plus
    ``restarts`` random starts (skopt: 2)."""
    from skopt.utils import cook_estimator

    model = cook_estimator("GP", space=space.dimensions, random_state=seed,
                           n_restarts_optimizer=restarts)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence warnings of the hyperparameter search
        model.fit(x, np.asarray(y, dtype=float))
    return model


def hyperparameters(model: Any) -> tuple[Any, float]:
    """A fitted skopt GP's kernel without its noise term, and the fitted white-noise level
    (skopt sets the noise term to 0 after the fit, for predictions, and keeps the level in
    ``noise_``; its kernel is ``amplitude * Matern + white noise``)."""
    noise = model.noise_ if model.noise_ is not None else 0.0
    return model.kernel_.k1, float(noise)


# skopt's GP kernel (cook_estimator): amplitude, one Matern-5/2 length scale per encoded
# dimension, and the white-noise level its GaussianProcessRegressor adds, each with its bounds
AMPLITUDE_BOUNDS = (0.01, 1000.0)
LENGTH_SCALE_BOUNDS = (0.01, 100.0)
NOISE_BOUNDS = (1e-5, 1e5)  # scikit-learn's WhiteKernel default


class MaternLikelihood:
    """The negative log marginal likelihood of skopt's GP (``amplitude * Matern-5/2 + white
    noise``, ``normalize_y``, scikit-learn's ``alpha``) on fixed points, and its gradient, in
    log-hyperparameters ordered as scikit-learn's ``kernel.theta`` (amplitude, length scales,
    noise): the same formulas as ``GaussianProcessRegressor.log_marginal_likelihood`` and
    the kernels' ``__call__``, on arrays computed once, without a kernel object per
    evaluation.  A hyperparameter search calls it a few hundred times; through scikit-learn
    each call cost 2.4 ms on 16-40 points (session 33), most of it object overhead."""

    def __init__(self, x: np.ndarray, y: Sequence[float]) -> None:
        values = np.asarray(y, dtype=float)
        spread = float(np.std(values))
        self.y = (values - np.mean(values)) / (spread if spread > 10 * np.finfo(float).eps
                                               else 1.0)
        self.x = np.asarray(x, dtype=float)
        self.sq = (self.x[:, np.newaxis, :] - self.x[np.newaxis, :, :]) ** 2
        n = len(self.y)
        self.eye = np.eye(n)
        self.constant = n / 2 * np.log(2 * np.pi)

    @property
    def bounds(self) -> np.ndarray:
        dims = self.x.shape[1]
        return np.log([AMPLITUDE_BOUNDS, *[LENGTH_SCALE_BOUNDS] * dims, NOISE_BOUNDS])

    def __call__(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        from scipy.linalg import cho_solve

        amplitude, scales, noise = np.exp(theta[0]), np.exp(theta[1:-1]), np.exp(theta[-1])
        # per dimension (x_i - x_j)^2 / l^2, and sqrt(5) r: the kernel and its gradient
        scaled = self.sq / scales**2
        root = np.sqrt(5.0 * scaled.sum(-1))
        decay = np.exp(-root)
        matern = (1.0 + root + root**2 / 3.0) * decay  # 1 on the diagonal (r = 0)
        gram = amplitude * matern
        gram[np.diag_indices_from(gram)] += noise + Posterior.ALPHA
        try:
            factor = cholesky(gram, lower=True, check_finite=False)
        except np.linalg.LinAlgError:
            return np.inf, np.zeros_like(theta)
        alpha = cho_solve((factor, True), self.y, check_finite=False)
        lml = -0.5 * self.y @ alpha - np.log(np.diag(factor)).sum() - self.constant
        inner = np.outer(alpha, alpha) - cho_solve((factor, True), self.eye, check_finite=False)
        per_scale = 5.0 / 3.0 * scaled * ((root + 1.0) * decay)[..., np.newaxis]
        gradient = np.empty_like(theta)
        # 0.5 * trace(inner @ dK/dtheta), each dK symmetric
        gradient[0] = 0.5 * amplitude * np.sum(inner * matern)
        gradient[1:-1] = 0.5 * amplitude * np.einsum("ij,ijk->k", inner, per_scale)
        gradient[-1] = 0.5 * noise * np.trace(inner)
        return -lml, -gradient


def search_hyperparameters(space: EncodedSpace, x: np.ndarray, y: Sequence[float], seed: int,
                           restarts: int) -> tuple[Any, float]:
    """:func:`fit_gp` then :func:`hyperparameters`, the search run on
    :class:`MaternLikelihood`: the same L-BFGS-B searches from the same starts (skopt's
    initial kernel, then ``restarts`` drawn as scikit-learn draws them from ``seed``), the
    best kept.  A space of categorical dimensions only (skopt's Hamming kernel) goes through
    :func:`fit_gp`."""
    from scipy.optimize import minimize  # type: ignore[import-untyped]
    from sklearn.gaussian_process.kernels import (  # type: ignore[import-untyped]
        ConstantKernel,
        Matern,
    )

    if space.categorical:
        return hyperparameters(fit_gp(space, x, y, seed, restarts))
    objective = MaternLikelihood(x, y)
    bounds = objective.bounds
    rng = np.random.RandomState(seed)
    starts = [np.zeros(len(bounds))]
    starts += [rng.uniform(bounds[:, 0], bounds[:, 1]) for _ in range(restarts)]
    optima = [minimize(objective, start, method="L-BFGS-B", jac=True, bounds=bounds)
              for start in starts]
    theta = optima[int(np.argmin([o.fun for o in optima]))].x
    kernel = ConstantKernel(np.exp(theta[0]), AMPLITUDE_BOUNDS) * Matern(
        length_scale=np.exp(theta[1:-1]), length_scale_bounds=[LENGTH_SCALE_BOUNDS]
        * (len(theta) - 2), nu=2.5)
    return kernel, float(np.exp(theta[-1]))


class Posterior:
    """The posterior of a Gaussian process with fixed hyperparameters, computed as skopt's
    ``GaussianProcessRegressor`` does (``normalize_y``; the white noise and scikit-learn's
    ``alpha`` of 1e-10 on the told points only), that can be told more points (a batch's lies)
    by appending a row to its Cholesky factor instead of refitting.

    Points whose mean and standard deviation are wanted repeatedly (the acquisition
    candidates) are :meth:`watch` ed: their solve against the factor is kept and extended by
    one row per told point, so a lie costs O(told x watched)."""

    ALPHA = 1e-10  # scikit-learn's GaussianProcessRegressor default, which skopt keeps

    def __init__(self, kernel: Any, noise: float, x: np.ndarray, y: Sequence[float]) -> None:
        values = np.asarray(y, dtype=float)
        self.kernel, self.noise = kernel, noise
        self.mean = float(np.mean(values))
        spread = float(np.std(values))
        self.scale = spread if spread > 0 else 1.0  # as scikit-learn's _handle_zeros_in_scale
        self.x = np.asarray(x, dtype=float)
        gram = kernel(self.x)
        gram[np.diag_indices_from(gram)] += noise + self.ALPHA
        self.factor = cholesky(gram, lower=True, check_finite=False)
        self.z = solve_triangular(self.factor, (values - self.mean) / self.scale, lower=True,
                                  check_finite=False)
        self._watched: list[_Watched] = []

    def watch(self, x: np.ndarray) -> _Watched:
        points = np.asarray(x, dtype=float)
        solved = solve_triangular(self.factor, self.kernel(self.x, points), lower=True,
                                  check_finite=False)
        watched = _Watched(points, self.kernel.diag(points), solved)
        self._watched.append(watched)
        return watched

    def mean_std(self, watched: _Watched) -> tuple[np.ndarray, np.ndarray]:
        """The predicted mean and standard deviation at the watched points, in told units."""
        variance = watched.prior - np.einsum("ij,ij->j", watched.solved, watched.solved)
        std = np.sqrt(np.maximum(variance, 0.0)) * self.scale
        return watched.solved.T @ self.z * self.scale + self.mean, std

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation at ``x`` (watched only for this call)."""
        watched = self.watch(x)
        self._watched.pop()
        return self.mean_std(watched)

    def tell(self, x: np.ndarray, y: float) -> None:
        """Condition on one more point (``x``: one encoded row) told ``y``."""
        point = np.asarray(x, dtype=float).reshape(1, -1)
        cross = self.kernel(self.x, point)[:, 0]
        row = solve_triangular(self.factor, cross, lower=True, check_finite=False)
        pivot = float(self.kernel.diag(point)[0] + self.noise + self.ALPHA - row @ row)
        pivot = np.sqrt(max(pivot, self.ALPHA))
        n = len(self.z)
        factor = np.zeros((n + 1, n + 1))
        factor[:n, :n] = self.factor
        factor[n, :n], factor[n, n] = row, pivot
        self.factor = factor
        self.z = np.append(self.z, ((y - self.mean) / self.scale - row @ self.z) / pivot)
        for watched in self._watched:
            extra = (self.kernel(point, watched.x)[0] - row @ watched.solved) / pivot
            watched.solved = np.vstack([watched.solved, extra])
        self.x = np.vstack([self.x, point])


class _Watched:
    def __init__(self, x: np.ndarray, prior: np.ndarray, solved: np.ndarray) -> None:
        self.x, self.prior, self.solved = x, prior, solved


def acquisition(name: str, mean: np.ndarray, std: np.ndarray, y_best: float, xi: float,
                kappa: float) -> np.ndarray:
    """skopt's acquisition values (``skopt.acquisition.gaussian_ei`` / ``_pi`` / ``_lcb``)
    from a posterior's mean and standard deviation, lower is better (EI and PI negated, as
    skopt's ``Optimizer`` minimizes them; 0 where the deviation is 0, as there)."""
    from scipy.special import ndtr  # type: ignore[import-untyped]  # what norm.cdf calls

    if name == "LCB":
        return mean - kappa * std
    values = np.zeros_like(mean)
    mask = std > 0
    improve = y_best - xi - mean[mask]
    scaled = improve / std[mask]
    if name == "PI":
        values[mask] = ndtr(scaled)
    else:
        density = np.exp(-0.5 * scaled**2) / np.sqrt(2 * np.pi)  # norm.pdf
        values[mask] = improve * ndtr(scaled) + std[mask] * density
    return -values


def checkpoint(history: int, first: int, growth: float) -> int:
    """How many of the first trials the hyperparameters are searched on, with ``history``
    trials finished: the largest of ``first``, then each step ``growth`` times the last
    (rounded up, at least one more), that is not above ``history``; ``history`` itself while
    it is below ``first`` (a search told a prior asks the model before its design is done)."""
    if history < first:
        return history
    at = first
    while (following := max(at + 1, math.ceil(at * growth))) <= history:
        at = following
    return at


@dataclass(frozen=True)
class Plan:
    """What one batch is asked with (from ``BayesSettings``, seeds derived per ask)."""

    acq_func: str  # gp_hedge, EI, LCB or PI
    xi: float
    kappa: float
    n_candidates: int
    local_candidates: int
    candidate_seed: int
    hedge_seed: int


class BatchProposer:
    """``fit_per=batch`` for one search: what it keeps between asks (the encoded space, the
    hyperparameters of the last checkpoint, the told points' neighbours) and its proposals.

    Each point of a batch is the best new one by the acquisition function among
    ``n_candidates`` valid points drawn uniformly and, with ``local_candidates``, the
    neighbours of the best told points (lies included), compared as ``BayesSearch`` compares
    them on skopt's proposal; then it is told the lie by extending the posterior."""

    def __init__(self, space: SearchSpace,
                 neighbours: Callable[[SearchSpace, Sequence[Any]], list[list[Any]]]) -> None:
        self.space = space
        self.encoded = EncodedSpace(space)
        self.neighbours = neighbours
        self.searches = 0  # hyperparameter searches run
        self.lies_told = 0
        self._hyper: dict[int, tuple[Any, float]] = {}
        self._nearby: dict[tuple[int, ...], list[tuple[int, ...]]] = {}

    def hyperparameters(self, at: int,
                        told: Callable[[], tuple[list[list[Any]], list[float]]],
                        seed: int, restarts: int) -> tuple[Any, float]:
        """The kernel and noise level searched on ``told()`` (the points and values as of
        checkpoint ``at``), searched once per checkpoint."""
        if at not in self._hyper:
            points, values = told()
            x = self.encoded.encode(np.asarray([self.encoded.row(p) for p in points]))
            self._hyper = {at: search_hyperparameters(self.encoded, x, values, seed, restarts)}
            self.searches += 1
        return self._hyper[at]

    def propose(self, points: Sequence[Sequence[Any]], values: Sequence[float], lie: float,
                hyper: tuple[Any, float], plan: Plan,
                is_new: Callable[[list[Any]], bool]) -> Iterator[list[Any]]:
        """The batch's points, best first, for as long as the caller asks: ``points`` and
        ``values`` are what the model is told (pending points at the lie); ``is_new`` says
        whether a point is neither known nor taken by the caller, who marks each yielded
        point taken before asking for the next.  Ends when no candidate is new."""
        rows = [self.encoded.row(p) for p in points]
        values = list(values)
        posterior = Posterior(*hyper, self.encoded.encode(np.asarray(rows)), values)
        drawn = self.encoded.sample(plan.candidate_seed, plan.n_candidates)
        # Repeats and told points could never be asked: scored once, in order of first draw,
        # they leave the ranking of the rest as it was.
        told = set(rows)
        first = np.unique(drawn, axis=0, return_index=True)[1]
        drawn = drawn[[i for i in sorted(first) if tuple(drawn[i].tolist()) not in told]]
        watched = posterior.watch(self.encoded.encode(drawn))
        hedge = random.Random(plan.hedge_seed)
        while True:
            name = hedge.choice(ACQUISITIONS) if plan.acq_func == "gp_hedge" else plan.acq_func
            scores = acquisition(name, *posterior.mean_std(watched), min(values), plan.xi,
                                 plan.kappa)
            ranked = (tuple(drawn[i].tolist()) for i in np.argsort(scores, kind="stable"))
            proposal = self._first_new(ranked, told, is_new)
            if plan.local_candidates:
                proposal = self._best_nearby(posterior, proposal, rows, values, told, plan,
                                             is_new)
            if proposal is None:
                return
            yield self.space.from_indices(proposal)
            told.add(proposal)
            rows.append(proposal)
            values.append(lie)
            posterior.tell(self.encoded.encode(np.asarray([proposal])), lie)
            self.lies_told += 1

    def _first_new(self, ranked: Iterable[tuple[int, ...]], told: set[tuple[int, ...]],
                   is_new: Callable[[list[Any]], bool]) -> tuple[int, ...] | None:
        """The first of ``ranked`` (index rows) that is neither told nor known nor taken."""
        checked = set(told)
        for row in ranked:
            if row not in checked:
                checked.add(row)
                if is_new(self.space.from_indices(row)):
                    return row
        return None

    def _best_nearby(self, posterior: Posterior, proposal: tuple[int, ...] | None,
                     rows: Sequence[tuple[int, ...]], values: Sequence[float],
                     told: set[tuple[int, ...]], plan: Plan,
                     is_new: Callable[[list[Any]], bool]) -> tuple[int, ...] | None:
        """The best new point by the acquisition function (EI for ``gp_hedge``, as
        :func:`~r3tui.search.local_candidates.best_local` scores skopt's proposal) among
        ``proposal`` and the neighbours of the best ``local_candidates`` told points (lies
        included); ties go to ``proposal``, then to the neighbours' fixed order."""
        order = sorted(range(len(values)), key=lambda i: (values[i], i))
        candidates = [] if proposal is None else [proposal]
        seen = told | set(candidates)
        for i in order[:plan.local_candidates]:
            if rows[i] not in self._nearby:
                self._nearby[rows[i]] = [self.encoded.row(p) for p in self.neighbours(
                    self.space, self.space.from_indices(rows[i]))]
            for move in self._nearby[rows[i]]:
                if move not in seen:
                    seen.add(move)
                    candidates.append(move)
        if not candidates:
            return None
        name = "EI" if plan.acq_func == "gp_hedge" else plan.acq_func
        mean, std = posterior.predict(self.encoded.encode(np.asarray(candidates)))
        scores = acquisition(name, mean, std, min(values), plan.xi, plan.kappa)
        return self._first_new((candidates[int(i)] for i in np.argsort(scores, kind="stable")),
                               told, is_new)
