"""The search core of R³: the inner search space, Bayesian optimization and its baselines.

Pure ask/tell, no I/O; scikit-optimize is imported only when a Bayesian search first asks the
model or builds its quasi-random design (``import r3tui.search`` does not load it).
"""

from r3tui.search.bayes import BayesSearch, BayesSettings
from r3tui.search.expressions import ExpressionError, Relation
from r3tui.search.source import (
    DeclarationError,
    Tunable,
    guard_defines,
    inject_launch_bounds,
    parse_relations,
    parse_tunables,
)
from r3tui.search.space import (
    DeviceLimits,
    LaunchSpec,
    OptionDim,
    SearchSpace,
    SpaceError,
    config_key,
    defines_for,
    option_dims,
)
from r3tui.search.strategy import (
    Budget,
    ExhaustiveSearch,
    InnerSearch,
    RandomSearch,
    TrialRecord,
)
from r3tui.search.winner import Finalist, Winner, choose_winner

__all__ = [
    "BayesSearch",
    "BayesSettings",
    "Budget",
    "DeclarationError",
    "DeviceLimits",
    "ExhaustiveSearch",
    "ExpressionError",
    "Finalist",
    "InnerSearch",
    "LaunchSpec",
    "OptionDim",
    "RandomSearch",
    "Relation",
    "SearchSpace",
    "SpaceError",
    "TrialRecord",
    "Tunable",
    "Winner",
    "choose_winner",
    "config_key",
    "defines_for",
    "guard_defines",
    "inject_launch_bounds",
    "option_dims",
    "parse_relations",
    "parse_tunables",
]
