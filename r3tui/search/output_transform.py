"""Output transforms of a Bayesian search: what its model fits, from the told log-times.

``BayesSettings.transform`` names one of :data:`TRANSFORMS`.  ``log`` tells the model log(time);
``rank`` the normal scores of the told values' ranks (:func:`normal_scores`); ``power`` a
Yeo-Johnson transform of the log-times fitted at each ask (scikit-learn's ``PowerTransformer``),
so the slow tail (``-O0``, tiny blocks, failures) weighs less in the fit; ``cap`` and ``mixed``
see ``BayesSettings.transform``.  No I/O; scipy and scikit-learn are imported only when a
transform needs them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

TRANSFORMS = ("log", "rank", "power", "cap", "mixed")


def normal_scores(values: Sequence[float]) -> list[float]:
    """Each value's rank (ties share their mean rank) as a standard normal quantile.  (scipy
    and scikit-learn come with scikit-optimize.)"""
    from scipy.stats import norm, rankdata  # type: ignore[import-untyped]

    return [float(q) for q in norm.ppf((rankdata(values) - 0.5) / len(values))] if values else []


def transformed(values: list[float], transform: str) -> list[float]:
    """What the model fits, from the told log-times: see ``BayesSettings.transform``."""
    if transform == "rank":
        return normal_scores(values)
    if transform == "mixed":
        # A portfolio of two fits: power on an even number of told values, log on an odd one.
        transform = "power" if len(values) % 2 == 0 else "log"
    if transform == "cap":
        # Winsorized from above: every value past the told median counts as the median, so
        # the slow tail (ptxas -O0, tiny blocks) stops dominating the fit.
        ceiling = statistics.median(values)
        return [min(v, ceiling) for v in values]
    if transform == "power" and len(set(values)) > 2:
        from sklearn.preprocessing import PowerTransformer  # type: ignore[import-untyped]

        low = min(values)
        fitted = PowerTransformer(method="yeo-johnson").fit_transform([[v - low] for v in values])
        return [float(row[0]) for row in fitted]
    return values
