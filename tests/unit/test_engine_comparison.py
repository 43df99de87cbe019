"""The ladder of the final re-timing (engine.comparison): the steps from the recorded
configuration to the winner, one level at a time."""

from __future__ import annotations

from r3tui.domain import Dim3, TrialConfig
from r3tui.engine.comparison import ladder, measurable

BASE = TrialConfig()
BEST = TrialConfig(options=("--use_fast_math",), block=Dim3(128), tunables={"R3_CF_X": 4},
                   launch_bounds=(128, 4), shared_mem_bytes=2048)


class Space:
    """What measurable asks of a search space: why a config cannot be sent."""

    def __init__(self, refused: set[str]) -> None:
        self.refused = refused

    def check(self, config: TrialConfig) -> list[str]:
        from r3tui.search import config_key

        return ["refused"] if config_key(config) in self.refused else []


def test_each_step_adds_one_level_of_the_winner() -> None:
    steps = ladder(BEST, BASE)
    assert [level for level, _ in steps] == ["source", "options", "launch"]
    source, options, launch = (c for _, c in steps)
    assert source == TrialConfig(tunables={"R3_CF_X": 4}, shared_mem_bytes=2048)
    assert options == TrialConfig(options=("--use_fast_math",), tunables={"R3_CF_X": 4},
                                  shared_mem_bytes=2048)
    assert launch == BEST


def test_a_level_the_winner_does_not_change_is_left_out() -> None:
    only_options = TrialConfig(options=("--use_fast_math",))
    assert ladder(only_options, BASE) == [("options", only_options)]
    # the winner at its variant's recorded configuration: the source gained it all
    assert ladder(BASE, BASE) == [("source", BASE)]


def test_a_step_that_cannot_run_merges_its_level_into_the_next() -> None:
    from r3tui.search import config_key

    steps = ladder(BEST, BASE)
    source_step = steps[0][1]
    refused = measurable(steps, Space({config_key(source_step)}), lambda c: True)
    assert [level for level, _ in refused] == ["source+options", "launch"]
    failed = measurable(steps, Space(set()), lambda c: c == BEST)
    assert failed == [("source+options+launch", BEST)]
    assert measurable(steps, Space(set()), lambda c: True) == steps


def test_the_fastest_step_ships_and_a_tie_keeps_the_smaller_change() -> None:
    from r3tui.engine.comparison import fastest_rung

    # source gains, options gain more, the launch step is slower again: options ships
    assert fastest_rung([[3.0, 3.1, 2.9], [2.0, 2.1, 1.9], [2.4, 2.5, 2.3]]) == 1
    assert fastest_rung([[3.0], [2.0], [1.0]]) == 2
    assert fastest_rung([[2.0, 2.0], [2.0, 2.0]]) == 0


class Rounds:
    """FAKE interleaved rounds: the original at 10 µs, the candidate at 10 µs / ``speedup``,
    each round's candidate time off by ``spread`` in a repeating pattern (a short kernel's
    per-round noise); counts what it was asked for."""

    def __init__(self, speedup: float, spread: float, pattern: int = 7) -> None:
        self.speedup, self.spread, self.pattern = speedup, spread, pattern
        self.asked: list[int] = []

    def __call__(self, n: int) -> tuple[list[float], list[float]]:
        start = sum(self.asked)
        self.asked.append(n)
        base = [10e-6] * n
        noise = [(((start + r) * 3) % self.pattern - self.pattern // 2) / (self.pattern // 2)
                 for r in range(n)]
        return base, [10e-6 / self.speedup * (1 + self.spread * x) for x in noise]


def test_confirm_stops_once_the_interval_is_narrow() -> None:
    from r3tui.engine.comparison import CONFIRM_ROUNDS, confirm

    rounds = Rounds(1.10, 0.005)
    f = confirm(BEST, rounds)
    assert rounds.asked == [CONFIRM_ROUNDS]
    assert f.config == BEST and len(f.ratios) == CONFIRM_ROUNDS
    assert abs(f.speedup - 1.10) < 0.01 and f.low <= 1.10 <= f.high


def test_confirm_adds_rounds_while_the_ratios_spread_up_to_its_bound() -> None:
    from r3tui.engine.comparison import CONFIRM_MAX_ROUNDS, CONFIRM_ROUNDS, confirm

    wide = Rounds(1.10, 0.10)
    f = confirm(BEST, wide)
    assert sum(wide.asked) == CONFIRM_MAX_ROUNDS and len(f.ratios) == CONFIRM_MAX_ROUNDS
    assert all(n <= CONFIRM_ROUNDS for n in wide.asked)
    # a spread between the two: more than one batch, fewer than the bound
    middle = Rounds(1.10, 0.04, pattern=11)
    g = confirm(BEST, middle)
    assert CONFIRM_ROUNDS < sum(middle.asked) < CONFIRM_MAX_ROUNDS
    assert g.high - g.low <= 0.04 * g.speedup
    # nothing measured (every round failed): no endless asking
    h = confirm(BEST, lambda n: ([], []))
    assert h.ratios == () and h.speedup != h.speedup  # nan


def test_confirm_stops_adding_rounds_after_its_time() -> None:
    from r3tui.engine.comparison import CONFIRM_ROUNDS, confirm

    now = [0.0]
    wide = Rounds(1.10, 0.10)

    def slow(n: int) -> tuple[list[float], list[float]]:
        now[0] += 6.0  # a replay of seconds: each batch takes 6 s
        return wide(n)

    f = confirm(BEST, slow, seconds=10.0, clock=lambda: now[0])
    assert wide.asked == [CONFIRM_ROUNDS, CONFIRM_ROUNDS] and len(f.ratios) == 2 * CONFIRM_ROUNDS
