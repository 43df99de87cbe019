"""The batch model (``fit_per=batch``): encoding and valid sampling, one hyperparameter search
per batch, distinct valid batches, resume.  Real scikit-optimize / scikit-learn fits; the
objective is the SYNTHETIC timing model of test_search_bayes.py (these tests check the driving
logic; search quality on recorded GPU measurements is bench/inner_bo.py's)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from r3tui.errors import ConfigError
from r3tui.search.bayes import BayesSearch, BayesSettings
from r3tui.search.source import Tunable
from r3tui.search.space import config_key
from r3tui.search.surrogate import (
    EncodedSpace,
    MaternLikelihood,
    Posterior,
    acquisition,
    fit_gp,
    hyperparameters,
    search_hyperparameters,
)
from tests.unit.test_search_bayes import FAST, drive, make_space, synthetic_time

BATCH = dict(fit_per="batch", **FAST)


def tied_space():
    """Most (TILE, block) pairs break the relation: a space with a constrained group."""
    return make_space(tunables=[Tunable("TILE", (1, 2, 4, 8, 16, 32, 64, 128), 1)],
                      relations=["TILE * BLOCK_X <= 2048"])


def test_the_encoding_is_skopts_and_draws_are_valid_and_uniform() -> None:
    from skopt.space import Space
    from skopt.utils import normalize_dimensions

    space = tied_space()
    encoded = EncodedSpace(space)
    groups = space.valid_groups()
    assert groups is not None and space.valid_groups(limit=1) is None
    assert space.size() == np.prod([len(valid) for _, valid in groups])
    rows = encoded.sample(seed=4, n=40 * space.size())
    points = [space.from_indices(r) for r in rows]
    assert all(space.is_valid_point(p) for p in points)
    assert [space.indices(p) for p in points[:5]] == [tuple(r) for r in rows[:5].tolist()]
    skopt_space = Space(normalize_dimensions(space.dimensions()))
    assert np.array_equal(encoded.encode(rows[:50]), skopt_space.transform(points[:50]))
    # every valid point is drawn, each about as often (uniform over the valid points)
    from scipy.stats import chisquare

    counts = Counter(space.key(p) for p in points)
    assert len(counts) == space.size()
    assert chisquare(list(counts.values())).pvalue > 0.01
    assert np.array_equal(encoded.sample(seed=4, n=len(rows)), rows)  # seeded


def test_the_posterior_is_skopts_and_a_lie_extends_it_without_a_fit() -> None:
    from skopt.acquisition import gaussian_ei, gaussian_lcb, gaussian_pi

    space = tied_space()
    encoded = EncodedSpace(space)
    rows = encoded.sample(seed=1, n=14)
    x = encoded.encode(rows)
    y = [float(np.log(synthetic_time(space.to_config(space.from_indices(r))))) for r in rows]
    model = fit_gp(encoded, x, y, seed=3, restarts=1)
    kernel, noise = hyperparameters(model)
    posterior = Posterior(kernel, noise, x, y)
    candidates = encoded.encode(encoded.sample(seed=9, n=300))
    watched = posterior.watch(candidates)
    mean, std = posterior.mean_std(watched)
    skopt_mean, skopt_std = model.predict(candidates, return_std=True)
    assert np.allclose(mean, skopt_mean) and np.allclose(std, skopt_std)
    best = min(y)
    assert np.allclose(acquisition("EI", mean, std, best, 0.01, 1.96),
                       -gaussian_ei(candidates, model, y_opt=best, xi=0.01))
    assert np.allclose(acquisition("PI", mean, std, best, 0.01, 1.96),
                       -gaussian_pi(candidates, model, y_opt=best, xi=0.01))
    assert np.allclose(acquisition("LCB", mean, std, best, 0.01, 1.96),
                       gaussian_lcb(candidates, model, kappa=1.96))
    # two lies: the same posterior as a factorization of all the points, normalized as before
    lies = candidates[:2]
    for row in lies:
        posterior.tell(row, best)
    again = Posterior(kernel, noise, np.vstack([x, lies]), [*y, best, best])
    again.mean, again.scale = posterior.mean, posterior.scale
    from scipy.linalg import solve_triangular

    again.z = solve_triangular(again.factor, (np.asarray([*y, best, best]) - again.mean)
                               / again.scale, lower=True)
    lied_mean, lied_std = posterior.mean_std(watched)
    assert np.allclose((lied_mean, lied_std), again.predict(candidates))
    assert lied_std[0] < std[0] and lied_std[1] < std[1]  # lied points are less uncertain
    assert np.allclose(posterior.predict(candidates[5:9]), (lied_mean[5:9], lied_std[5:9]))


@pytest.mark.parametrize("n", [8, 40])
def test_the_numpy_likelihood_and_search_are_scikit_learns(n: int) -> None:
    space = tied_space()
    encoded = EncodedSpace(space)
    rows = encoded.sample(seed=n, n=n)
    x = encoded.encode(rows)
    y = [float(np.log(synthetic_time(space.to_config(space.from_indices(r))))) for r in rows]
    model = fit_gp(encoded, x, y, seed=7, restarts=2)
    likelihood = MaternLikelihood(x, y)
    bounds = likelihood.bounds
    assert np.allclose(bounds, model.kernel.bounds)  # skopt's kernel, its white noise added
    for theta in (np.zeros(len(bounds)), np.random.default_rng(n).uniform(*bounds.T)):
        value, gradient = likelihood(theta)
        lml, lml_gradient = model.log_marginal_likelihood(theta, eval_gradient=True)
        assert np.isclose(value, -lml, rtol=1e-10)
        assert np.allclose(gradient, -lml_gradient, rtol=1e-7, atol=1e-9)
    # the same searches from the same starts: the same hyperparameters
    kernel, noise = search_hyperparameters(encoded, x, y, seed=7, restarts=2)
    expected, expected_noise = hyperparameters(model)
    assert np.allclose(kernel.theta, expected.theta, atol=1e-6)
    assert np.isclose(noise, expected_noise, rtol=1e-6)
    assert repr(kernel) == repr(expected)


@pytest.mark.parametrize("local", [0, 3])
def test_a_batch_is_valid_distinct_and_costs_one_hyperparameter_search(local: int) -> None:
    space = tied_space()
    search = BayesSearch(space, seed=5, settings=BayesSettings(local_candidates=local, **BATCH))
    drive(search, FAST["n_initial_points"], batch=3)
    assert search.model_fits == 0  # the design needs no model
    pending = search.ask(2)  # the design is told: from the model
    assert (search.model_fits, search.lies_told) == (1, 1)
    batch = search.ask(5)  # the two pending points told a lie; the history has not grown
    keys = [config_key(c) for c in pending + batch]
    assert len(set(keys)) == 7 and not set(keys) & {r.key for r in search.history}
    assert all(space.check(c) == [] for c in batch)
    assert (search.model_fits, search.lies_told) == (1, 5)  # no new fit, for lies or else
    for config in pending + batch:
        search.tell(config, synthetic_time(config))
    model_batches = 2
    while len(search.history) < 61:
        fits = search.model_fits
        asked = search.ask(8)
        assert search.model_fits - fits <= 1  # at most one hyperparameter search per batch
        for config in asked:
            search.tell(config, synthetic_time(config))
        model_batches += 1
    assert len({r.key for r in search.history}) == 61 and search.fallbacks == 0
    # searched on the first 6 trials, then on 9, 21, 32 and 48 (the history grows by 1.5x
    # from 6: 9, 14, 21, 32, 48; 14 fell between two asks, at 13 and 21 trials)
    assert search.model_fits == 5 < model_batches == 8


def test_skopts_optimizer_refits_at_every_point_of_a_batch() -> None:
    """The contrast ``fit_per=point`` keeps: one hyperparameter search per asked point."""
    search = BayesSearch(make_space(), seed=5, settings=BayesSettings(fit_per="point", **FAST))
    drive(search, FAST["n_initial_points"])
    search.ask(4)
    assert (search.model_fits, search.lies_told) == (4, 0)


def test_auto_searches_once_an_ask_until_batch_after_trials_then_as_the_history_grows() -> None:
    """``fit_per=auto``: the batch model with one hyperparameter search at every ask (where
    skopt's Optimizer searches at every lie: 4 a batch of 4) until ``batch_after`` trials are
    finished, then only as the history grows by ``gp_search_growth``."""
    space = make_space()
    after = FAST["n_initial_points"] + 8
    auto = BayesSearch(space, seed=6, settings=BayesSettings(fit_per="auto",
                                                             batch_after=after, **FAST))
    drive(auto, FAST["n_initial_points"], batch=4)
    asks = 0
    while len(auto.history) < after:
        fits = auto.model_fits
        asked = auto.ask(4)
        assert auto.model_fits == fits + 1 and len({config_key(c) for c in asked}) == 4
        for config in asked:
            auto.tell(config, synthetic_time(config))
        asks += 1
    assert asks == 2 and auto.lies_told == 3 * asks
    fits = auto.model_fits
    for config in auto.ask(4):  # at batch_after trials: the growth schedule starts, one search
        auto.tell(config, synthetic_time(config))
    assert auto.model_fits == fits + 1
    fits = auto.model_fits
    auto.ask(4)  # 4 more than batch_after, less than 1.5x: the hyperparameters are held
    assert auto.model_fits == fits
    with pytest.raises(ConfigError, match="batch_after"):
        BayesSettings(fit_per="auto", batch_after=0)


def test_auto_asks_a_search_told_a_prior_what_point_asks_until_batch_after() -> None:
    """A child told its ancestors' trials keeps skopt's Optimizer below ``batch_after`` told
    points (the lineage test of test_search_simulation.py needs it)."""
    space = make_space()
    parent = BayesSearch(space, seed=3, settings=BayesSettings(**FAST))
    drive(parent, FAST["n_initial_points"] + 4, batch=4)
    after = len(parent.history) + 12
    children = []
    for fit_per in ("auto", "point"):
        child = BayesSearch(space, seed=6, settings=BayesSettings(fit_per=fit_per,
                                                                  batch_after=after, **FAST))
        child.set_prior([parent.history])
        children.append(child)
    auto, point = children
    assert drive(auto, 8, batch=4) == drive(point, 8, batch=4)
    assert auto.lies_told == 0 and auto.model_fits == point.model_fits > 0


def test_batch_asks_are_seeded_and_resume_asks_what_the_uninterrupted_search_does() -> None:
    space = make_space()
    settings = BayesSettings(**BATCH)
    asked = drive(BayesSearch(space, seed=8, settings=settings), 20, batch=4)
    assert drive(BayesSearch(space, seed=8, settings=settings), 20, batch=4) == asked
    interrupted = BayesSearch(space, seed=8, settings=settings)
    drive(interrupted, 12, batch=4)
    resumed = BayesSearch(space, seed=8, settings=settings)
    resumed.resume([(r.config, r.time_s) for r in interrupted.history])
    assert drive(resumed, 20, batch=4) == asked[12:]
    crashed = BayesSearch(space, seed=9, settings=settings)
    drive(crashed, 10, batch=3)
    lost = crashed.ask(3)  # pending when it crashed
    again = BayesSearch(space, seed=9, settings=settings)
    again.resume(crashed.history)
    assert again.ask(3) == lost


def test_a_small_space_is_searched_to_its_end_without_repeats() -> None:
    space = make_space()
    search = BayesSearch(space, seed=2, settings=BayesSettings(**BATCH))
    asked = drive(search, 10_000, batch=8)
    assert sorted(map(config_key, asked)) == sorted(map(config_key, space.enumerate()))


def test_batch_settings_are_checked_and_forests_keep_skopts_optimizer() -> None:
    with pytest.raises(ConfigError, match="fit_per"):
        BayesSettings(fit_per="ask")
    with pytest.raises(ConfigError, match="gp_restarts"):
        BayesSettings(gp_restarts=-1)
    with pytest.raises(ConfigError, match="gp_restarts_late"):
        BayesSettings(gp_restarts_late=-1)
    for growth in (0.5, float("inf")):
        with pytest.raises(ConfigError, match="gp_search_growth"):
            BayesSettings(gp_search_growth=growth)
    search = BayesSearch(make_space(), seed=3,
                         settings=BayesSettings(estimator="ET", **BATCH))
    drive(search, 10, batch=2)
    assert search.lies_told == 0 and search.model_fits == 2 * 2  # skopt's constant liar


def test_draws_fall_back_to_rejection_when_a_group_cannot_be_listed() -> None:
    space = tied_space()
    encoded = EncodedSpace(space)
    encoded.groups = None  # as for a group of more than 200 000 raw combinations
    rows = encoded.sample(seed=1, n=50)
    assert rows.shape == (50, len(space.dims))
    assert all(space.is_valid_point(space.from_indices(r)) for r in rows)
    assert np.array_equal(encoded.sample(seed=1, n=50), rows)
