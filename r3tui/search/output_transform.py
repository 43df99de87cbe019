"""Output transforms of a Bayesian search: what its model fits, from the told log-times.

``BayesSettings.transform`` names one of :data:`TRANSFORMS`.  ``log`` tells the model log(time);
``rank`` the normal scores of the told values' ranks (:func:`normal_scores`); ``power`` a
Yeo-Johnson transform of the log-times fitted at each ask (what scikit-learn's
``PowerTransformer`` gives, on numpy: :func:`yeo_johnson_standardized`),
so the slow tail (``-O0``, tiny blocks, failures) weighs less in the fit; ``cap`` and ``mixed``
see ``BayesSettings.transform``.  No I/O; scipy and scikit-learn are imported only when a
transform needs them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

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
        low = min(values)
        return yeo_johnson_standardized([v - low for v in values])
    return values


def yeo_johnson(x: Any, lmbda: float) -> Any:
    """The Yeo-Johnson transform of the array ``x`` with parameter ``lmbda``."""
    import numpy as np

    out = np.empty_like(x)
    pos = x >= 0
    if abs(lmbda) < 1e-19:
        out[pos] = np.log1p(x[pos])
    else:
        out[pos] = np.expm1(lmbda * np.log1p(x[pos])) / lmbda
    if abs(lmbda - 2) > 1e-19:
        out[~pos] = -np.expm1((2 - lmbda) * np.log1p(-x[~pos])) / (2 - lmbda)
    else:
        out[~pos] = -np.log1p(-x[~pos])
    return out


def yeo_johnson_standardized(values: Sequence[float]) -> list[float]:
    """What scikit-learn's ``PowerTransformer(method="yeo-johnson")`` gives for one column:
    the transform at the maximum-likelihood ``lmbda`` (Brent's method from the bracket
    (-2, 2), as scipy's ``yeojohnson_normmax``), then standardized (population deviation).
    Written here on numpy: through scipy's wrappers each likelihood costs a millisecond and
    one fit 15 ms, which a 200-trial campaign paid about 50 times."""
    import numpy as np
    from scipy import optimize  # type: ignore[import-untyped]

    x = np.asarray(values, dtype=float)
    n = len(x)
    tiny = np.finfo(float).tiny
    log_terms = float((np.sign(x) * np.log1p(np.abs(x))).sum())

    def negative_log_likelihood(lmbda: float) -> float:
        variance = float(yeo_johnson(x, lmbda).var())
        if variance < tiny:
            return float("inf")
        return n / 2 * float(np.log(variance)) - (lmbda - 1) * log_terms

    with np.errstate(over="ignore", invalid="ignore"):
        lmbda = float(optimize.brent(negative_log_likelihood, brack=(-2.0, 2.0)))
    y = yeo_johnson(x, lmbda)
    spread = float(y.std())
    centred = y - y.mean()
    return [float(v) for v in (centred / spread if spread > 0 else centred)]
