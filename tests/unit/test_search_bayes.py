"""Bayesian search with real scikit-optimize runs, and its random / exhaustive baselines.

The objective here is a SYNTHETIC timing model (a smooth function of the config), because these
tests check the driving logic — validity, penalties, batches, warm start, resume, budgets — not
how fast a kernel is.  Recorded GPU measurements are used in test_search_simulation.py.
"""

from __future__ import annotations

import math
import random

import pytest

from r3tui.compile.options import accepted_options, canonicalize
from r3tui.domain import Dim3, Measurement, MeasurementStatus, TimeStats, TrialConfig
from r3tui.errors import ConfigError
from r3tui.search.bayes import (
    GENERATORS,
    BayesSearch,
    BayesSettings,
    neighbours,
    normal_scores,
    transformed,
)
from r3tui.search.source import Tunable
from r3tui.search.space import LaunchSpec, SearchSpace, config_key, option_dims
from r3tui.search.strategy import Budget, ExhaustiveSearch, RandomSearch, TrialRecord

FAST = dict(n_initial_points=6, n_candidates=300)  # small budgets keep GP fitting quick


def make_space(**extra) -> SearchSpace:
    names = ("use_fast_math", "ftz", "maxrregcount", "opt-level")
    dims = [d for d in option_dims(accepted_options("nvrtc")) if d.name in names]
    return SearchSpace.from_parts(dims, LaunchSpec(Dim3(64), Dim3(1 << 20), True), **extra)


def synthetic_time(config: TrialConfig) -> float:
    """SYNTHETIC: fastest at 256 threads, -O3 (default), maxrregcount 64 and fast math."""
    block = config.block or Dim3(64)
    t = 1e-4 * (1 + 0.3 * abs(math.log2(block.x) - 8))
    opts = " ".join(config.options)
    t *= 2.0 if "-O0" in opts else 1.3 if "-O1" in opts else 1.1 if "-O2" in opts else 1.0
    t *= 1.4 if "maxrregcount=32" in opts else 0.95 if "maxrregcount=64" in opts else 1.0
    return t * (0.9 if "use_fast_math" in opts else 1.0)


def drive(search, n: int, batch: int = 1, fail=lambda c: False) -> list[TrialConfig]:
    asked: list[TrialConfig] = []
    budget = Budget(max_trials=n)
    while not search.done(budget):
        configs = search.ask(min(batch, search.remaining(budget)))
        asked.extend(configs)
        for config in configs:
            search.tell(config, MeasurementStatus.COMPILE_ERROR if fail(config)
                        else synthetic_time(config))
    return asked


def test_broken_and_unknown_settings_are_refused() -> None:
    for estimator in ("GBRT", "dummy"):
        with pytest.raises(ConfigError, match="does not work here"):
            BayesSettings(estimator=estimator)
    with pytest.raises(ConfigError):
        BayesSettings(initial_point_generator="normal")
    with pytest.raises(ConfigError):
        BayesSettings(batch_strategy="cl_median")
    for bad in ({"xi": -0.01}, {"kappa": float("nan")}, {"xi": float("inf")}):
        with pytest.raises(ConfigError, match="xi and kappa"):
            BayesSettings(**bad)


def test_xi_and_kappa_reach_the_acquisition_function() -> None:
    settings = BayesSettings(acq_func="LCB", xi=0.002, kappa=0.5, **FAST)
    optimizer = BayesSearch(make_space(), seed=1, settings=settings)._optimizer()
    assert optimizer.acq_func == "LCB"
    assert optimizer.acq_func_kwargs == {"xi": 0.002, "kappa": 0.5}


def test_gp_search_asks_valid_distinct_configs_and_improves() -> None:
    space = make_space()
    search = BayesSearch(space, seed=1, settings=BayesSettings(**FAST))
    asked = drive(search, 16)
    assert len(asked) == 16 == len({config_key(c) for c in asked})
    for config in asked:
        assert space.check(config) == []
        canonicalize("nvrtc", config.options)
    best = search.best()
    assert best is not None
    design_best = min(synthetic_time(c) for c in asked[:6])
    assert best[1] <= design_best
    assert best[1] <= 1.1 * 0.95 * 0.9e-4  # within 10% of the synthetic optimum


@pytest.mark.parametrize("estimator", ["RF", "ET"])
def test_forest_estimators_work(estimator: str) -> None:
    search = BayesSearch(make_space(), seed=2, settings=BayesSettings(estimator=estimator,
                                                                      **FAST))
    asked = drive(search, 10)
    assert len({config_key(c) for c in asked}) == 10


def test_failures_are_told_a_penalty_and_kept() -> None:
    space = make_space()
    search = BayesSearch(space, seed=3, settings=BayesSettings(**FAST))
    configs = search.ask(5)
    ok = Measurement(MeasurementStatus.OK, time=TimeStats(2e-4, 1.9e-4, 1e-6, 20))
    search.tell(configs[0], MeasurementStatus.TIMEOUT)
    assert search.objective(search.history) == [0.0]  # nothing finite yet: all equal
    search.tell(configs[1], ok)
    search.tell(configs[2], 1e-4)
    search.tell(configs[3], float("nan"))
    search.tell(configs[4], Measurement(MeasurementStatus.WRONG_RESULT, error_text="mismatch"))
    statuses = [r.status for r in search.history]
    assert statuses == [MeasurementStatus.TIMEOUT, MeasurementStatus.OK, MeasurementStatus.OK,
                        MeasurementStatus.CRASHED, MeasurementStatus.WRONG_RESULT]
    penalty = math.log(2e-4) + math.log(2.0)  # twice the worst finite time, in log space
    assert search.objective(search.history) == pytest.approx(
        [penalty, math.log(2e-4), math.log(1e-4), penalty, penalty])
    assert search.best() == (configs[2], 1e-4)
    assert search.history[4].reason == "mismatch"
    # failures do not stop the model: asks continue and never repeat a failed point
    more = drive(search, 12, fail=lambda c: "maxrregcount=32" in " ".join(c.options))
    assert not {config_key(c) for c in more} & {config_key(c) for c in configs}


def test_invalid_proposals_are_told_a_penalty_when_sampling_is_unconstrained() -> None:
    # most (TILE, block) pairs break the relation; skopt sees the raw space here
    space = make_space(tunables=[Tunable("TILE", (1, 2, 4, 8, 16, 32, 64, 128), 1)],
                       relations=["TILE * BLOCK_X <= 2048"])
    settings = BayesSettings(constrain_sampling=False, **FAST)
    search = BayesSearch(space, seed=4, settings=settings)
    asked = drive(search, 12)
    assert all(space.check(c) == [] for c in asked)
    invalid = [r for r in search.history if not r.evaluated]
    assert search.invalid_count == len(invalid) > 0
    assert search.n_evaluated == 12
    assert all(r.reason and space.check(r.config) for r in invalid)
    resumed = BayesSearch(space, seed=4, settings=settings)
    resumed.resume(search.history)  # invalid records are told again, not evaluated
    assert resumed.invalid_count == search.invalid_count and resumed.n_evaluated == 12
    # with the constraint (the default) the optimizer only proposes valid points
    constrained = BayesSearch(space, seed=4, settings=BayesSettings(**FAST))
    drive(constrained, 12)
    assert constrained.invalid_count == 0


def test_batched_asks_are_distinct_and_skip_pending_points() -> None:
    search = BayesSearch(make_space(), seed=5, settings=BayesSettings(**FAST))
    first = search.ask(4)
    second = search.ask(4)  # nothing told yet: the design continues
    keys = [config_key(c) for c in first + second]
    assert len(set(keys)) == 8 and len(search.pending) == 8
    for config in first + second[:2]:
        search.tell(config, synthetic_time(config))
    batch = search.ask(4)  # from the model, with the two pending points told a lie
    batch_keys = {config_key(c) for c in batch}
    assert len(batch_keys) == 4 and not batch_keys & set(keys)


@pytest.mark.parametrize("strategy", ["cl_mean", "cl_max"])
def test_other_constant_liar_strategies(strategy: str) -> None:
    search = BayesSearch(make_space(), seed=6, settings=BayesSettings(batch_strategy=strategy,
                                                                      **FAST))
    asked = drive(search, 12, batch=4)
    assert len({config_key(c) for c in asked}) == 12


def test_warm_start_configs_are_asked_first() -> None:
    space = make_space()
    parent_best = [TrialConfig(options=("--use_fast_math",), block=Dim3(256)),
                   TrialConfig(options=("--maxrregcount=64",), block=Dim3(128)),
                   TrialConfig(options=("--maxrregcount=40",))]  # not a point: skipped
    search = BayesSearch(space, seed=7, settings=BayesSettings(**FAST))
    assert search.warm_start(parent_best) == 2
    first = search.ask(3)
    assert first[:2] == parent_best[:2]
    assert config_key(first[2]) not in {config_key(c) for c in parent_best}
    random_search = RandomSearch(space, seed=7)
    random_search.warm_start(parent_best)
    assert random_search.ask(1) == parent_best[:1]


def test_resume_gives_the_same_next_asks() -> None:
    space = make_space()
    settings = BayesSettings(**FAST)
    uninterrupted = BayesSearch(space, seed=8, settings=settings)
    asked = drive(uninterrupted, 12)
    interrupted = BayesSearch(space, seed=8, settings=settings)
    drive(interrupted, 8)
    assert [r.config for r in interrupted.history] == asked[:8]
    resumed = BayesSearch(space, seed=8, settings=settings)
    resumed.resume([(r.config, r.time_s) for r in interrupted.history])
    assert resumed.n_evaluated == 8
    assert drive(resumed, 12) == asked[8:]  # the same points an uninterrupted run asks


def test_resume_after_batches_never_re_asks_evaluated_points() -> None:
    space = make_space()
    search = BayesSearch(space, seed=9, settings=BayesSettings(**FAST))
    drive(search, 10, batch=3, fail=lambda c: c.block == Dim3(32))
    pending = search.ask(3)  # lost in the crash
    resumed = BayesSearch(space, seed=9, settings=BayesSettings(**FAST))
    resumed.resume(search.history)
    assert [r.key for r in resumed.history] == [r.key for r in search.history]
    assert resumed.best() == search.best()
    nxt = resumed.ask(3)
    assert not {config_key(c) for c in nxt} & {r.key for r in search.history}
    assert {config_key(c) for c in nxt} == {config_key(c) for c in pending}


def _one_step_moves(space: SearchSpace, point: list) -> list[list]:
    """Every point one step from ``point`` in one dimension, valid or not."""
    out = []
    for j, dim in enumerate(space.dims):
        values = ([point[j] - 1, point[j] + 1] if dim.ordinal
                  else [label for label in dim.labels if label != point[j]])
        out += [[*point[:j], v, *point[j + 1:]] for v in values
                if not dim.ordinal or 0 <= v < len(dim.choices)]
    return out


def test_neighbours_are_valid_distinct_one_or_two_steps_away() -> None:
    # most (TILE, block) pairs break the relation, so some moves are invalid
    space = make_space(tunables=[Tunable("TILE", (1, 2, 4, 8, 16, 32, 64, 128), 1)],
                       relations=["TILE * BLOCK_X <= 2048"])
    invalid_moves = 0
    for point in [space.baseline_point(), *space.sample(random.Random(3), 5)]:
        near = neighbours(space, point)
        invalid_moves += sum(not space.is_valid_point(p) for p in _one_step_moves(space, point))
        assert near == neighbours(space, point)  # a fixed order
        assert len({tuple(p) for p in near}) == len(near) and point not in near
        assert all(space.is_valid_point(p) for p in near)
        steps = [p for p in _one_step_moves(space, point) if space.is_valid_point(p)]
        assert steps and near[:len(steps)] == steps  # every valid one-step move, first
        for p in near:
            assert 1 <= sum(a != b for a, b in zip(p, point, strict=True)) <= 2
        two = [p for p in near if sum(a != b for a, b in zip(p, point, strict=True)) == 2]
        assert two  # moves in two dimensions are there too
    assert invalid_moves > 0  # and the invalid ones were left out
    assert neighbours(space, ["no such point"]) == []


def test_local_candidates_are_valid_deterministic_and_resume() -> None:
    with pytest.raises(ConfigError):
        BayesSettings(local_candidates=-1)
    space = make_space()
    settings = BayesSettings(local_candidates=3, **FAST)
    asked = drive(BayesSearch(space, seed=8, settings=settings), 14)
    assert drive(BayesSearch(space, seed=8, settings=settings), 14) == asked  # same seed
    assert len({config_key(c) for c in asked}) == 14
    assert all(space.check(c) == [] for c in asked)
    interrupted = BayesSearch(space, seed=8, settings=settings)
    drive(interrupted, 9)
    resumed = BayesSearch(space, seed=8, settings=settings)
    resumed.resume([(r.config, r.time_s) for r in interrupted.history])
    assert drive(resumed, 14) == asked[9:]
    batched = BayesSearch(space, seed=5, settings=settings)
    keys = [config_key(c) for c in drive(batched, 16, batch=4)]
    assert len(set(keys)) == 16  # constant-liar batches stay distinct


def test_local_candidates_change_the_asks_toward_the_incumbent() -> None:
    """With the neighbours of the best told points among the candidates, some model asks are
    one of those neighbours that skopt's random candidates did not offer."""
    space = make_space()
    plain = drive(BayesSearch(space, seed=2, settings=BayesSettings(local_candidates=0,
                                                                    **FAST)), 16)
    local = drive(BayesSearch(space, seed=2, settings=BayesSettings(local_candidates=3,
                                                                    **FAST)), 16)
    n = FAST["n_initial_points"]
    assert plain[:n] == local[:n] and plain != local


def test_time_budget_with_a_fake_clock() -> None:
    now = [100.0]
    budget = Budget(max_seconds=10.0, clock=lambda: now[0])
    search = RandomSearch(make_space(), seed=1)
    assert not search.done(budget)  # starts the clock
    now[0] = 109.5
    search.tell(search.ask(1)[0], 1e-4)
    assert not search.done(budget) and search.elapsed(budget) == pytest.approx(9.5)
    now[0] = 110.0
    assert search.done(budget)
    resumed = RandomSearch(make_space(), seed=1)
    resumed.resume(search.history, elapsed_s=9.0)
    assert not resumed.done(budget)  # 9 s spent before the crash, the clock restarts now
    now[0] = 111.0
    assert resumed.done(budget)


def test_trial_budget_counts_pending_asks() -> None:
    search = RandomSearch(make_space(), seed=2)
    budget = Budget(max_trials=5)
    assert search.remaining(budget) == 5
    configs = search.ask(3)
    assert search.remaining(budget) == 2 and not search.done(budget)
    search.ask(2)
    assert search.done(budget)
    for config in configs:
        search.tell(config, MeasurementStatus.CRASHED)
    assert search.remaining(budget) == 0 and search.n_evaluated == 3


@pytest.mark.parametrize("generator", GENERATORS)
def test_every_initial_point_generator_gives_a_valid_design(generator: str) -> None:
    space = make_space()
    search = BayesSearch(space, seed=3, settings=BayesSettings(
        initial_point_generator=generator, **FAST))
    design = search.ask(6)
    assert len({config_key(c) for c in design}) == 6
    assert all(space.check(c) == [] for c in design)
    again = BayesSearch(space, seed=3, settings=BayesSettings(
        initial_point_generator=generator, **FAST))
    assert again.ask(6) == design  # seeded


def test_random_search_is_seeded_uniform_and_exhausts_a_small_space() -> None:
    space = make_space()
    assert RandomSearch(space, seed=4).ask(10) == RandomSearch(space, seed=4).ask(10)
    assert RandomSearch(space, seed=4).ask(10) != RandomSearch(space, seed=5).ask(10)
    search = RandomSearch(space, seed=4)
    asked = drive(search, 10_000)
    assert search.done(Budget()) and search.exhausted
    assert sorted(map(config_key, asked)) == sorted(map(config_key, space.enumerate()))


def test_exhaustive_search_covers_the_space_once() -> None:
    space = make_space()
    search = ExhaustiveSearch(space)
    asked = drive(search, 10_000, batch=7)
    assert asked == list(space.enumerate())
    assert search.best() == min(((c, synthetic_time(c)) for c in asked), key=lambda p: p[1])


def test_records_outside_the_space_count_for_best_but_not_the_model() -> None:
    space = make_space()
    outside = TrialConfig(options=("-lineinfo",))
    search = BayesSearch(space, seed=5, settings=BayesSettings(**FAST))
    search.tell(outside, 1e-6)
    assert search.best() == (outside, 1e-6)
    assert TrialRecord.of(outside, 1e-6).ok
    drive(search, 10)
    assert search.n_evaluated == 10


def test_a_prior_is_shifted_onto_the_childs_scale() -> None:
    """A parent's trials, told to a child whose source runs everything 0.8x as long: after the
    child measures one config the parent has, the prior is told at the child's level."""
    space = make_space()
    parent = BayesSearch(space, seed=3, settings=BayesSettings(**FAST))
    drive(parent, 8, fail=lambda c: c.block == Dim3(32))
    child = BayesSearch(space, seed=4, settings=BayesSettings(**FAST))
    assert child.set_prior([parent.history]) == len(parent.history)
    best_config, best_s = parent.best() or (None, 0.0)
    assert best_config is not None
    child.tell(best_config, 0.8 * best_s)
    points, values, penalty = child._told()
    assert len(points) == len(parent.history)  # the shared config is told once, the child's
    told = dict(zip((space.key(p) for p in points), values, strict=True))
    for record in parent.history:
        if record.ok and record.time_s:
            assert told[record.key] == pytest.approx(math.log(0.8 * record.time_s))
        else:  # the parent's failures stay failures, at the child's penalty
            assert told[record.key] == penalty
    assert penalty == pytest.approx(max(v for v in values if v != penalty) + math.log(2.0))


def test_nearer_ancestors_set_the_scale_of_farther_ones() -> None:
    """A grandparent that shares no config with the child is shifted through the parent."""
    space = make_space()
    a, b, c = (TrialConfig(block=Dim3(x)) for x in (64, 128, 256))
    grandparent = [TrialRecord.of(b, 4e-4), TrialRecord.of(c, 2e-4)]
    parent = [TrialRecord.of(a, 3e-4), TrialRecord.of(b, 2e-4)]
    child = BayesSearch(space, seed=5, settings=BayesSettings(**FAST))
    child.set_prior([parent, grandparent])
    child.tell(a, 1.5e-4)  # the child is 2x faster than the parent, 4x than the grandparent
    told = dict(zip((space.key(p) for p in child._told()[0]), child._told()[1], strict=True))
    assert told[config_key(b)] == pytest.approx(math.log(1e-4))
    assert told[config_key(c)] == pytest.approx(math.log(0.5e-4))
    assert child.n_prior_points() == 2
    assert [r.config for r in child.history] == [a]  # the prior is not history


def test_a_prior_replaces_the_initial_design_and_is_ignored_without_a_model() -> None:
    space = make_space()
    parent = BayesSearch(space, seed=6, settings=BayesSettings(**FAST))
    drive(parent, 10)
    child = BayesSearch(space, seed=7, settings=BayesSettings(**FAST))
    child.set_prior([parent.history])
    asked = drive(child, 4)
    assert child._design is None  # enough prior data: the model proposes from the start
    assert not {config_key(c) for c in asked} & {r.key for r in parent.history}
    without = BayesSearch(space, seed=7, settings=BayesSettings(**FAST))
    drive(without, 4)
    assert without._design is not None
    # random search has no model: a prior changes nothing
    plain, primed = RandomSearch(space, seed=2), RandomSearch(space, seed=2)
    primed.set_prior([parent.history])
    assert drive(plain, 5) == drive(primed, 5)


def test_a_search_told_a_prior_uses_the_prior_settings() -> None:
    """Cold, a search runs ``acq_func``/``transform``/``local_candidates``; told a usable prior,
    the ``prior_*`` ones: it asks exactly what a search set up with those in their place does."""
    space = make_space()
    parent = BayesSearch(space, seed=8, settings=BayesSettings(**FAST))
    drive(parent, 8)
    cold = dict(acq_func="gp_hedge", transform="power", local_candidates=3)
    warm = dict(acq_func="PI", transform="rank", local_candidates=0)
    prior = {f"prior_{k}": v for k, v in warm.items()}
    settings = BayesSettings(**FAST, **cold, **prior)
    child = BayesSearch(space, seed=9, settings=settings)
    assert child.in_force == settings
    child.set_prior([parent.history])
    assert child.in_force == settings.with_prior() != settings
    assert (child.in_force.acq_func, child.in_force.transform) == ("PI", "rank")
    assert child._optimizer().acq_func == "PI"
    same = BayesSearch(space, seed=9, settings=BayesSettings(**FAST, **warm, **prior))
    same.set_prior([parent.history])
    assert drive(child, 6) == drive(same, 6)
    # a prior with no point of this space leaves the cold settings in force
    other = BayesSearch(space, seed=9, settings=settings)
    assert other.set_prior([[], [TrialRecord.of(TrialConfig(block=Dim3(7)), 1e-4)]]) == 0
    assert other.in_force == settings
    assert BayesSettings().with_prior().local_candidates == BayesSettings().prior_local_candidates


def test_normal_scores_keep_the_order_and_share_ties() -> None:
    scores = normal_scores([3.0, -1.0, 7.5, 3.0, 100.0])
    assert scores[1] < scores[0] == scores[3] < scores[2] < scores[4]
    assert sum(normal_scores([5.0, 1.0, 2.0, 9.0])) == pytest.approx(0.0, abs=1e-12)  # symmetric
    # a failure penalty far above the rest is one step up, however far
    assert normal_scores([1.0, 2.0, 1e6]) == pytest.approx(normal_scores([1.0, 2.0, 3.0]))
    assert normal_scores([]) == []


def test_cap_and_mixed_transforms() -> None:
    values = [0.5, 3.0, 0.1, 2.0, 0.7]
    # cap: everything past the median (0.7) counts as the median; the rest is untouched
    assert transformed(values, "cap") == [0.5, 0.7, 0.1, 0.7, 0.7]
    # mixed: log (unchanged) on an odd number of told values, power on an even one
    assert transformed(values, "mixed") == values
    assert transformed(values[:4], "mixed") == transformed(values[:4], "power")
    assert transformed(values[:4], "power") != values[:4]


@pytest.mark.parametrize("seed", range(6))
def test_the_power_transform_is_scikit_learns(seed: int) -> None:
    # written on numpy for speed; it must give what PowerTransformer gives (log-times of a
    # search: a slow tail, ties, a few values)
    import random

    import numpy as np
    from sklearn.preprocessing import PowerTransformer

    rng = random.Random(seed)
    n = rng.choice([3, 5, 16, 40, 200])
    times = [rng.lognormvariate(-9, rng.uniform(0.05, 2.0)) for _ in range(n)]
    times[: n // 4] = [times[0]] * (n // 4)  # ties, as repeated configurations give
    logs = [float(np.log(t)) for t in times]
    low = min(logs)
    expected = PowerTransformer(method="yeo-johnson").fit_transform([[v - low] for v in logs])
    assert transformed(logs, "power") == pytest.approx(list(expected[:, 0]), abs=1e-6)


@pytest.mark.parametrize("transform", ["rank", "power", "cap", "mixed"])
def test_output_transforms_are_valid_deterministic_and_move_the_model(transform: str) -> None:
    with pytest.raises(ConfigError, match="transform"):
        BayesSettings(transform="sqrt")
    space = make_space()
    # EI without local candidates, so only the transform differs from ``plain``
    single = dict(acq_func="EI", local_candidates=0, **FAST)
    settings = BayesSettings(transform=transform, **single)
    asked = drive(BayesSearch(space, seed=3, settings=settings), 16)
    assert drive(BayesSearch(space, seed=3, settings=settings), 16) == asked
    assert len({config_key(c) for c in asked}) == 16
    assert all(space.check(c) == [] for c in asked)
    plain = drive(BayesSearch(space, seed=3, settings=BayesSettings(transform="log", **single)),
                  16)
    n = FAST["n_initial_points"]
    assert plain[:n] == asked[:n] and plain != asked  # same design, other model asks


def test_settings_parse_a_spec_over_a_base_and_print_what_changed() -> None:
    assert BayesSettings.parse("defaults") == BayesSettings()
    assert BayesSettings.parse("") == BayesSettings()
    settings = BayesSettings.parse(
        "acq_func=gp_hedge, transform=power,n_initial_points=12,xi=0.05,constrain_sampling=off",
        estimator="ET",
    )
    assert (settings.acq_func, settings.transform, settings.n_initial_points) == (
        "gp_hedge", "power", 12)
    assert (settings.xi, settings.constrain_sampling, settings.estimator) == (0.05, False, "ET")
    assert BayesSettings.parse("estimator=RF", estimator="ET").estimator == "RF"  # spec wins
    assert BayesSettings.parse(settings.changed()) == settings
    assert BayesSettings().changed() == "defaults"
    for bad, message in [("colour=red", "want NAME=VALUE"), ("xi", "want NAME=VALUE"),
                         ("xi=abc", "xi is float"), ("n_initial_points=2.5", "is int"),
                         ("constrain_sampling=maybe", "is bool"),
                         ("transform=sqrt", "transform 'sqrt' is not one of"),
                         ("prior_transform=sqrt", "prior_transform 'sqrt' is not one of"),
                         ("prior_acq_func=UCB", "prior_acq_func 'UCB' is not one of"),
                         ("prior_local_candidates=-1", "must be at least 0")]:
        with pytest.raises(ConfigError, match=message):
            BayesSettings.parse(bad)
