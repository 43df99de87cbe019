"""Winner selection under timing noise, with SYNTHETIC noisy samples.

The samples come from a seeded random model of a GPU timer (a per-round drift shared by every
config, plus independent jitter): the point is to check the statistics, which need many
seeds, not the GPU.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from r3tui.domain import Dim3, TrialConfig
from r3tui.search.space import config_key
from r3tui.search.winner import choose_winner, summarize

BASELINE = TrialConfig()
A = TrialConfig(block=Dim3(128))
B = TrialConfig(block=Dim3(256))
C = TrialConfig(block=Dim3(512))


def synthetic_retimer(true_s: list[tuple[TrialConfig, float]], seed: int, jitter: float = 0.03,
                      drift: float = 0.05, fail: TrialConfig | None = None):
    """SYNTHETIC: samples[r][i] = true time x round drift x (1 + jitter noise)."""
    rng = random.Random(seed)
    by_key = {config_key(c): t for c, t in true_s}
    calls: list[tuple[list[TrialConfig], int]] = []

    def retime(configs: Sequence[TrialConfig], rounds: int) -> list[list[float]]:
        calls.append((list(configs), rounds))
        rows = []
        for _ in range(rounds):
            shared = 1.0 + rng.uniform(-drift, drift)
            rows.append([math.nan if c == fail
                         else by_key[config_key(c)] * shared * (1.0 + rng.gauss(0.0, jitter))
                         for c in configs])
        return rows

    return retime, calls


def test_the_true_best_wins_in_most_seeds() -> None:
    true_s = [(BASELINE, 100e-6), (A, 90e-6), (B, 86e-6), (C, 88e-6)]  # B is 2-4 % ahead of A and C
    wins = 0
    for seed in range(20):
        retime, calls = synthetic_retimer(true_s, seed)
        winner = choose_winner([A, B, C], BASELINE, retime, rounds=9)
        assert calls[0][0] == [BASELINE, A, B, C] and calls[0][1] == 9
        wins += winner.config == B
        assert winner.best.significant  # 14 % faster than the baseline is beyond the noise
        assert winner.best.low <= winner.speedup <= winner.best.high
    assert wins >= 14


def test_a_tie_reports_a_spread_that_includes_one() -> None:
    ties = 0
    for seed in range(10):
        retime, _ = synthetic_retimer([(BASELINE, 100e-6), (A, 100e-6)], seed)
        winner = choose_winner([A], BASELINE, retime)
        assert winner.best.low <= 1.0 <= winner.best.high
        assert not winner.best.significant
        assert 1.0 <= winner.speedup < 1.1  # A when its median ratio is above 1, else the baseline
        if winner.config == A:
            ties += 1
            assert winner.best.iqr > 0
        else:
            assert winner.config == BASELINE and winner.speedup == 1.0
    assert 0 < ties < 10  # noise decides, both ways


def test_a_finalist_slower_than_the_baseline_loses_to_it() -> None:
    for seed in range(10):
        retime, _ = synthetic_retimer([(BASELINE, 100e-6), (A, 104e-6), (B, 110e-6)], seed,
                                      jitter=0.01, drift=0.02)
        winner = choose_winner([A, B], BASELINE, retime)
        assert winner.config == BASELINE and winner.speedup == 1.0
        assert [f.config for f in winner.ranking] == [BASELINE, A, B]
        assert winner.ranking[1].speedup < 1.0


def test_failed_rounds_and_the_baseline_among_the_finalists() -> None:
    retime, calls = synthetic_retimer([(BASELINE, 100e-6), (A, 80e-6), (B, 90e-6)], 1, fail=A)
    winner = choose_winner([A, BASELINE, B], BASELINE, retime)
    assert calls[0][0] == [BASELINE, A, B]  # the baseline is timed once
    assert winner.config == B  # A never produced a usable time
    ranked = [f.config for f in winner.ranking]
    assert ranked == [B, BASELINE, A]
    assert winner.ranking[1].speedup == 1.0 and winner.ranking[1].iqr == 0.0
    assert math.isnan(winner.ranking[2].speedup)
    assert winner.baseline_median_s == pytest.approx(100e-6, rel=0.1)


def test_summary_and_bad_input() -> None:
    summary = summarize(A, [2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 2.0, float("inf")])
    assert summary.ratios == (2.0, 2.0, 1.0) and summary.speedup == 2.0
    with pytest.raises(ValueError):
        choose_winner([], BASELINE, lambda configs, rounds: [])
    with pytest.raises(ValueError, match="expected 3 rounds"):
        choose_winner([A], BASELINE, lambda configs, rounds: [[1.0, 1.0]], rounds=3)


def test_an_interval_says_faster_only_with_the_rounds_its_confidence_needs() -> None:
    """Five rounds all faster happen 1 time in 16 by chance: their whole range covers the
    median 93.8% of the time, short of 95%, so the finalist is not called faster."""
    five = summarize(A, [1.1] * 5, [1.0] * 5)
    assert five.low > 1 and five.coverage == pytest.approx(1 - 2 / 32)
    assert not five.significant
    six = summarize(A, [1.1] * 6, [1.0] * 6)
    assert six.coverage >= 0.95 and six.significant
    # nine rounds (the default): the 2nd and 8th ratios, not a bootstrap's narrower range
    nine = summarize(A, [1.0] * 9, [1 / r for r in (0.9, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06,
                                                    1.07, 1.3)])
    assert (nine.low, nine.high) == pytest.approx((1.01, 1.07))
    assert nine.significant
