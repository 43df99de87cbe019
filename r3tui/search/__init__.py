"""The search core of R³: the inner search space, Bayesian optimization and its baselines,
and the outer loop's MAP-Elites archive.

Pure ask/tell, no I/O; scikit-optimize is imported only when a Bayesian search first asks the
model or builds its quasi-random design (``import r3tui.search`` does not load it).
"""

from r3tui.search.bayes import BayesSearch, BayesSettings
from r3tui.search.elites import (
    DEFAULT_FEATURES,
    FAMILIES,
    ArchiveSettings,
    Elite,
    EliteArchive,
    FeatureDim,
    cell_coordinates,
    cell_key,
    describe,
)
from r3tui.search.expressions import ExpressionError, Relation
from r3tui.search.source import (
    DeclarationError,
    Tunable,
    guard_defines,
    inject_launch_bounds,
    parse_first,
    parse_relations,
    parse_shared,
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
    "DEFAULT_FEATURES",
    "FAMILIES",
    "ArchiveSettings",
    "BayesSearch",
    "BayesSettings",
    "Budget",
    "DeclarationError",
    "DeviceLimits",
    "Elite",
    "EliteArchive",
    "ExhaustiveSearch",
    "ExpressionError",
    "FeatureDim",
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
    "cell_coordinates",
    "cell_key",
    "choose_winner",
    "config_key",
    "defines_for",
    "describe",
    "guard_defines",
    "inject_launch_bounds",
    "option_dims",
    "parse_first",
    "parse_relations",
    "parse_shared",
    "parse_tunables",
]
