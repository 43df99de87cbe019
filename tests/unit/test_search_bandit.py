"""Thompson sampling over transformations (r3tui.search.bandit): what has gained comes first
more often, what has not been tried still comes first at times, and a seed fixes the order."""

from __future__ import annotations

import random

import pytest

from r3tui.search.bandit import ArmRecord, preference

NAMES = ("gains", "never_gains", "untried")
RECORDS = {"gains": ArmRecord(10, 6), "never_gains": ArmRecord(10, 0)}


def test_the_order_follows_the_gains_and_still_explores() -> None:
    firsts = [preference(NAMES, RECORDS, random.Random(seed))[0] for seed in range(400)]
    share = {name: firsts.count(name) / len(firsts) for name in NAMES}
    # Beta(7, 5) beats the untried arm's uniform draw with probability 0.58 (its mean)
    assert 0.5 < share["gains"] < 0.68
    assert 0.32 < share["untried"] < 0.5  # never tried: first often, until it has a record
    assert share["never_gains"] < 0.02  # Beta(1, 11) rarely draws above both


def test_a_seed_fixes_the_order_and_every_name_is_kept() -> None:
    one = preference(NAMES, RECORDS, random.Random(5))
    assert one == preference(NAMES, RECORDS, random.Random(5))
    assert sorted(one) == sorted(NAMES)


def test_a_record_cannot_gain_more_than_it_tried() -> None:
    with pytest.raises(ValueError):
        ArmRecord(2, 3)


def test_a_prior_counts_like_the_campaigns_own_record() -> None:
    """A hint starts with two misses: before any evidence it comes first less often than an
    untried transformation without a prior, and with the prior a record of its own weighs
    as it would after two misses in the campaign."""
    names = ("hint", "plain")
    prior = {"hint": ArmRecord(2, 0)}
    firsts = [preference(names, {}, random.Random(seed), prior)[0] for seed in range(600)]
    # Beta(1, 3) above a uniform draw: probability 1/4
    assert 0.18 < firsts.count("hint") / len(firsts) < 0.32
    same = [preference(names, {"hint": ArmRecord(2, 0)}, random.Random(seed))
            for seed in range(50)]
    assert same == [preference(names, {}, random.Random(seed), prior) for seed in range(50)]
    # evidence outweighs it: a hint that gained 5 of 6 in the campaign leads again
    led = [preference(names, {"hint": ArmRecord(6, 5)}, random.Random(seed), prior)[0]
           for seed in range(400)]
    assert led.count("hint") / len(led) > 0.6


def test_the_catalogues_hints_are_the_compiler_hints() -> None:
    from r3tui.remix.catalogue import CATALOGUE

    assert {t.name for t in CATALOGUE if t.hint} == {
        "restrict_const", "read_only_loads", "unroll_inner_loop", "expose_tunable"}
