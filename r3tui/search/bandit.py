"""Which transformation to try next: Thompson sampling over what each one has gained so far.

A campaign's proposals are one named transformation each (a rule operator or a catalogue entry
for the model).  Each has a record in the campaign: how many of its variants were evaluated and
how many were faster than their parent.  Every proposal draws, per transformation, from the
Beta distribution of its gain rate (uniform before any evidence) and tries the transformations
in the order of the draws: what has gained is tried first more often, what has never been tried
still comes first now and then, and a transformation that keeps failing sinks without being
ruled out.  The draws come from the campaign's seeded generator, so a re-run makes the same
choices.  Pure: the engine reads the counts from the database.

A transformation that is a hint to the compiler (``Transformation.hint``: aliasing, read-only
caching, an unroll pragma, a named constant) starts with two misses: on the H200 (session 29,
29 rules-only campaigns over six examples) restrict_const gained beyond 1.03x in 1 of 17
variants, read_only_loads in 0 of 14 (4 were 0.64-0.71x), unroll_inner_loop in 3 of 18,
while warp shuffles, shared-memory tiles, vector loads and split loops gained in 6 of 6,
4 of 11, 4 of 6 and 1 of 7.  With four or five proposals a campaign, a uniform start spent
half of them on hints.
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
               rng: random.Random, prior: Mapping[str, ArmRecord] | None = None
               ) -> tuple[str, ...]:
    """``names`` in the order to try them: by a draw from Beta(1 + gained, 1 + not gained),
    ``prior``'s counts (what a transformation is known to do before this campaign) added to
    the campaign's own."""
    draws = {}
    for name in names:
        r = records.get(name, ArmRecord())
        before = (prior or {}).get(name, ArmRecord())
        gained = r.gained + before.gained
        draws[name] = rng.betavariate(1 + gained, 1 + r.tried + before.tried - gained)
    return tuple(sorted(names, key=lambda n: -draws[n]))
