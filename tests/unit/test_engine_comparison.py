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
