"""Which transformation to try next: Thompson sampling over what each one has gained so far.

A campaign's proposals are one named transformation each (a rule operator or a catalogue entry
for the model).  Each has a record in the campaign: how many of its variants were evaluated and
how many were faster than their parent.  Every proposal draws, per transformation, from the
Beta distribution of its gain rate (uniform before any evidence) and tries the transformations
in the order of the draws: what has gained is tried first more often, what has never been tried
still comes first now and then, and a transformation that keeps failing sinks without being
ruled out.  The draws come from the campaign's seeded generator, so a re-run makes the same
choices.  Pure: the engine reads the counts from the database.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ArmRecord:
    """One transformation's record in a campaign."""

    tried: int = 0  # variants of it evaluated (or failed before evaluation)
    gained: int = 0  # of those, faster than their parent

    def __post_init__(self) -> None:
        if not 0 <= self.gained <= self.tried:
            raise ValueError(f"gained {self.gained} of {self.tried} tried")


def preference(names: Sequence[str], records: Mapping[str, ArmRecord],
               rng: random.Random) -> tuple[str, ...]:
    """``names`` in the order to try them: by a draw from Beta(1 + gained, 1 + not gained)."""
    draws = {}
    for name in names:
        r = records.get(name, ArmRecord())
        draws[name] = rng.betavariate(1 + r.gained, 1 + r.tried - r.gained)
    return tuple(sorted(names, key=lambda n: -draws[n]))
