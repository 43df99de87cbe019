"""The loop: ask → remix → compile → replay → persist → tell.

The engine wires the pure search core (``r3tui.search``) and the remix layer to the compile
pool, the replay worker and the experiment database.  ``inner`` searches one source variant's
configurations (Bayesian optimization); ``campaign`` is the outer MAP-Elites loop over source
variants, each tuned by the inner loop; ``control`` turns signals into pause/stop requests.
"""

from r3tui.engine.inner import (
    Evaluator,
    InnerCampaign,
    InnerResult,
    InnerSettings,
    KernelSource,
    ReplayEvaluator,
    build_space,
    compile_failure,
    compile_request,
    make_strategy,
    run_inner,
    run_inner_campaign,
)

__all__ = [
    "Evaluator",
    "InnerCampaign",
    "InnerResult",
    "InnerSettings",
    "KernelSource",
    "ReplayEvaluator",
    "build_space",
    "compile_failure",
    "compile_request",
    "make_strategy",
    "run_inner",
    "run_inner_campaign",
]
