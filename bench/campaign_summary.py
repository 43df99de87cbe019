"""The summary of bench/campaigns.py, computed from its database alone (no GPU needed).

Every search of the benchmark is one campaign named ``<example>-<kind>-s<seed>`` with kind
``r3`` (remix + inner BO), ``bo`` (inner BO on the original source) or ``remix`` (outer loop,
no inner loop), and with ``--ablate-transfer`` ``r3nt`` (r3 whose children are not told their
ancestors' trials: the settings before that change).  A search's score is its speedup over
the recorder's timing of the original launch (``launch.baseline.median_s`` of the recording's
manifest, the same denominator for all of them): baseline / best median of its ok trials.

Only seeds whose three searches all finished are compared (same seed, same budget); an example
with fewer seeds than asked for, or none, is named in the ``cut_short`` lines, so a summary of a
run that hit its time limit says so instead of looking complete.

R³ over BO alone is compared seed by seed (the same seed's two searches), and each example's
figure is the median of its seeds' ratios with the order-statistic interval of that median
(the one r3 apply and the re-timed winners use): at 6 seeds it covers 95%, at 5 the whole range
covers 93.8% and is called within noise.  With the ceilings the run measured
(bench/ceilings.py, kept beside the database as ``<db>.ceilings.json``), each example's tuned
kernel (r3's best, median over its seeds) is put against the copy bandwidth or the FMA rate,
and sgemm's against cuBLAS on the same matrices.
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

KINDS = ("r3", "bo", "remix")
# the searches issue #19's comparison needs (campaigns.py --no-remix runs only these)
COMPARED = ("r3", "bo")
# ``--ablate-transfer``: r3 with the settings before transfer (no ancestors' trials, warm start 3)
ABLATION = "r3nt"
if TYPE_CHECKING:
    from r3tui.engine.report import Climbs

_NAME = re.compile(r"^(?P<example>.+)-(?P<kind>r3|bo|remix|r3nt)-s(?P<seed>\d+)$")


@dataclass(frozen=True)
class SearchResult:
    """One campaign of the benchmark, as read back from the database."""

    example: str
    kind: str
    seed: int
    finished: bool
    baseline_s: float | None
    best_s: float | None
    n_trials: int
    n_evaluated: int  # variants out of the funnel (seed included), pending ones left out
    wall_s: float | None  # started to finished; None while not finished

    @property
    def speedup(self) -> float | None:
        if self.baseline_s is None or not self.best_s:
            return None
        return self.baseline_s / self.best_s


@dataclass(frozen=True)
class Ceilings:
    """What the GPU reached in the run (bench/ceilings.py measures it)."""

    copy_bytes_per_s: float  # device-to-device copy, read and write counted
    fma_flops_per_s: float  # fp32 FMA chain
    cublas_sgemm_s: float | None = None  # cuBLAS on sgemm's own matrices; None: not timed
    cublas_how: str = ""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> Ceilings | None:
        return cls(**json.loads(path.read_text())) if path.is_file() else None


def ceilings_path(db: Path) -> Path:
    return db.with_name(db.name + ".ceilings.json")


@dataclass(frozen=True)
class Work:
    """One launch's work: bytes moved (``bound`` memory) or FLOPs (compute)."""

    bound: str
    amount: float


def seed_interval(values: Sequence[float], confidence: float = 0.95
                  ) -> tuple[float, float, float, str]:
    """(median, low, high, note) of per-seed values: the order-statistic interval of the
    median, and what it covers where that is less than ``confidence`` ("" otherwise)."""
    from r3tui.search.winner import median_ci_coverage, order_statistic_median_ci, pairs_for

    low, high = order_statistic_median_ci(values, confidence)
    coverage = median_ci_coverage(len(values), confidence)
    note = "" if coverage >= confidence else (
        f"{len(values)} seeds: a {coverage:.1%} interval; {confidence:.0%} needs "
        f"{pairs_for(confidence)}")
    return statistics.median(values), low, high, note


def ratio_verdict(low: float, high: float, note: str) -> str:
    """What a ratio's interval says against 1: "" for a gain, else why it is not one."""
    if note:
        return f"within noise ({note})"
    if low > 1.0:
        return ""
    return "below 1 beyond the noise" if high < 1.0 else "within noise"


def read_results(db: Path) -> list[SearchResult]:
    """Every benchmark campaign in ``db`` (other campaigns, e.g. LLM ones, are left out)."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import CampaignStatus, VariantStatus

    out = []
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        for summary in repo.list_campaign_summaries(s):
            match = _NAME.match(summary.name)
            campaign = repo.get_campaign(s, summary.id)
            if match is None or campaign is None:
                continue
            manifest = repo.get_recording_manifest(s, campaign.recording_id) or {}
            baseline = (manifest.get("launch") or {}).get("baseline") or {}
            wall = None
            if campaign.started_at is not None and campaign.finished_at is not None:
                wall = (campaign.finished_at - campaign.started_at).total_seconds()
            evaluated = sum(
                v.status is not VariantStatus.PENDING for v in repo.campaign_variants(s, summary.id)
            )
            out.append(
                SearchResult(
                    example=match["example"],
                    kind=match["kind"],
                    seed=int(match["seed"]),
                    finished=summary.status is CampaignStatus.FINISHED,
                    baseline_s=baseline.get("median_s"),
                    best_s=summary.best_time_s,
                    n_trials=summary.n_trials,
                    n_evaluated=evaluated,
                    wall_s=wall,
                )
            )
    return out


def complete_seeds(results: Sequence[SearchResult], kinds: Sequence[str] = KINDS
                   ) -> dict[str, dict[int, dict[str, float]]]:
    """example -> seed -> kind -> speedup, for the seeds whose searches of ``kinds`` all
    finished with a speedup (a search with no ok trial scores 0: it found nothing that
    runs)."""
    by_seed: dict[tuple[str, int], dict[str, SearchResult]] = {}
    for r in results:
        by_seed.setdefault((r.example, r.seed), {})[r.kind] = r
    out: dict[str, dict[int, dict[str, float]]] = {}
    for (example, seed), found in sorted(by_seed.items()):
        if not set(kinds) <= set(found) or not all(found[k].finished for k in kinds):
            continue
        out.setdefault(example, {})[seed] = {
            k: r.speedup or 0.0 for k, r in found.items() if k in kinds or r.finished
        }
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _budget(budget: int | str | None) -> str:
    """A number of trials, or a described budget (``Budgets.describe``)."""
    if budget is None:
        return "? trials per search"
    return budget if isinstance(budget, str) else f"{budget} trials per search"


def summary_lines(
    results: Sequence[SearchResult], examples: Sequence[str], seeds: int,
    budget: int | str | None,
    ceilings: Ceilings | None = None, work: Mapping[str, Work] | None = None,
    kinds: Sequence[str] = KINDS,
) -> list[str]:
    """The table and the ``key: value`` lines of issue #5, over what ``results`` hold (a seed
    counts once its searches of ``kinds`` finished: without remix, its columns are "-")."""
    complete = complete_seeds(results, kinds)
    ablated = any(ABLATION in k for seeds_ in complete.values() for k in seeds_.values())
    lines = [
        f"budget: {_budget(budget)}; {seeds} seeds asked; "
        "speedup over the recorded launch, median over the complete seeds",
        f"{'example':11} {'seeds':>5} {'r3':>7} {'bo':>7} {'remix':>7} {'r3/bo':>7} "
        f"{'r3/remix':>8}" + (f" {ABLATION:>7} {ABLATION + '/bo':>8}" if ablated else ""),
    ]
    over_bo: dict[str, float] = {}
    over_remix: dict[str, float] = {}
    intervals: dict[str, tuple[float, float, float, str]] = {}
    ablation_over_bo: dict[str, float] = {}
    cut = []
    for example in examples:
        done = complete.get(example, {})
        if len(done) < seeds:
            cut.append(f"{example} ({len(done)} of {seeds} seeds)")
        if not done:
            lines.append(f"{example:11} {0:5d}  not run")
            continue
        m = {k: statistics.median(s[k] for s in done.values()) for k in COMPARED}
        # seed by seed: the same seed's searches, then the median of those ratios
        paired_bo = [_ratio(s["r3"], s["bo"]) for s in done.values()]
        over_bo[example] = statistics.median(paired_bo)
        with_remix = [s for s in done.values() if "remix" in s]
        remix, r3_remix = f"{'-':>7}", f"{'-':>8}"
        if with_remix:
            over_remix[example] = statistics.median(_ratio(s["r3"], s["remix"])
                                                    for s in with_remix)
            remix = f"{statistics.median(s['remix'] for s in with_remix):7.3f}"
            r3_remix = f"{over_remix[example]:8.3f}"
        intervals[example] = seed_interval(paired_bo)
        row = (
            f"{example:11} {len(done):5d} {m['r3']:7.3f} {m['bo']:7.3f} {remix} "
            f"{over_bo[example]:7.3f} {r3_remix}"
        )
        # the ablation over the seeds that have it, against bo on the same seeds
        paired = [s for s in done.values() if ABLATION in s]
        if paired:
            nt = statistics.median(s[ABLATION] for s in paired)
            ablation_over_bo[example] = statistics.median(_ratio(s[ABLATION], s["bo"])
                                                          for s in paired)
            row += f" {nt:7.3f} {ablation_over_bo[example]:8.3f}"
        lines.append(row)
    keys = [("r3_over_bo_only", over_bo)]
    if "remix" in kinds or over_remix:
        keys.append(("r3_over_remix_only", over_remix))
    if ablated:
        keys.append((f"{ABLATION}_over_bo_only", ablation_over_bo))
    for key, ratios in keys:
        if ratios:
            worst = min(ratios, key=lambda e: ratios[e])
            interval = ""
            if key == "r3_over_bo_only":  # with the worst example's interval over its seeds
                _, low, high, note = intervals[worst]
                verdict = ratio_verdict(low, high, note)
                interval = f" [{low:.3f}, {high:.3f}]" + (f" {verdict}" if verdict else "")
            lines.append(f"{key}: {ratios[worst]:.3f}{interval}  (worst example: {worst})")
        else:
            lines.append(f"{key}: nan  (no example has a complete seed)")
    for example, (median, low, high, note) in intervals.items():
        verdict = ratio_verdict(low, high, note)
        lines.append(f"r3_over_bo_only[{example}]: {median:.3f} [{low:.3f}, {high:.3f}]"
                     + (f" {verdict}" if verdict else "")
                     + f"  (median of {len(complete[example])} seeds' r3/bo)")
    if over_bo:
        high_gain = [e for e, r in over_bo.items() if r >= 1.2]
        lines.append(f"r3_over_bo_only_at_least_1.2: {len(high_gain)} of {len(over_bo)} "
                     f"examples ({', '.join(high_gain) or 'none'}; point estimates)")
    if ceilings is not None:
        lines += ceiling_lines(results, complete, ceilings, work or {})
    for kind in KINDS:
        per_trial = [
            r.wall_s / r.n_trials for r in results if r.kind == kind and r.wall_s and r.n_trials
        ]
        if per_trial:
            lines.append(f"s_per_trial_{kind}: {statistics.median(per_trial):.3f}  (median)")
    per_variant = [
        r.wall_s / r.n_evaluated for r in results if r.kind == "r3" and r.wall_s and r.n_evaluated
    ]
    if per_variant:
        lines.append(
            f"s_per_evaluated_variant: {statistics.median(per_variant):.2f}  "
            "(r3 searches, median of wall time / variants evaluated)"
        )
    lines.append(f"cut_short: {'; '.join(cut) if cut else 'none'}")
    return lines


def ceiling_lines(results: Sequence[SearchResult],
                  complete: Mapping[str, Mapping[int, Mapping[str, float]]],
                  ceilings: Ceilings, work: Mapping[str, Work]) -> list[str]:
    """``tuned_fraction_of_ceiling[example]`` (r3's best time, median over the complete seeds,
    against the copy bandwidth or the FMA rate) and ``sgemm_fraction_of_cublas`` (cuBLAS's
    time over r3's best, per seed, with its interval over the seeds)."""
    best = {(r.example, r.seed, r.kind): r.best_s for r in results if r.best_s}
    lines = [f"ceilings: copy {ceilings.copy_bytes_per_s / 1e12:.2f} TB/s (read+write), "
             f"fp32 FMA {ceilings.fma_flops_per_s / 1e12:.1f} TFLOP/s, cuBLAS SGEMM "
             + (f"{ceilings.cublas_sgemm_s * 1e6:.1f} us" if ceilings.cublas_sgemm_s
                else "-") + (f" ({ceilings.cublas_how})" if ceilings.cublas_how else "")]
    for example, seeds in complete.items():
        if example not in work:
            continue
        times = {kind: [best[(example, seed, kind)] for seed in seeds
                        if (example, seed, kind) in best] for kind in ("r3", "bo")}
        if not times["r3"]:
            continue
        w = work[example]
        ceiling, what = ((ceilings.copy_bytes_per_s, "of copy bandwidth") if w.bound == "memory"
                         else (ceilings.fma_flops_per_s, "of the fp32 FMA rate"))
        fraction = {k: w.amount / statistics.median(t) / ceiling for k, t in times.items() if t}
        lines.append(f"tuned_fraction_of_ceiling[{example}]: {fraction['r3']:.3f} {what}  "
                     f"(r3's best, median of {len(times['r3'])} seeds"
                     + (f"; BO alone {fraction['bo']:.3f}" if "bo" in fraction else "") + ")")
    sgemm = [best[("sgemm", seed, "r3")] for seed in complete.get("sgemm", {})
             if ("sgemm", seed, "r3") in best]
    if sgemm and ceilings.cublas_sgemm_s:
        median, low, high, note = seed_interval([ceilings.cublas_sgemm_s / t for t in sgemm])
        lines.append(f"sgemm_fraction_of_cublas: {median:.3f} [{low:.3f}, {high:.3f}]  "
                     f"(cuBLAS {ceilings.cublas_sgemm_s * 1e6:.1f} us over r3's best per seed, "
                     f"{len(sgemm)} seeds; {note or 'a 95% interval'})")
    elif "sgemm" in complete:
        lines.append(f"sgemm_fraction_of_cublas: n/a (cuBLAS {ceilings.cublas_how or 'not timed'})")
    return lines


def model_tag(model_path: str) -> str:
    """A short name for a model file: ``SmolLM2-135M-Instruct.Q4_1.gguf`` -> ``smollm2``,
    ``qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`` -> ``qwen2.5``."""
    match = re.match(r"[a-z]+[0-9.]*", Path(model_path).name.lower())
    return match[0].rstrip(".") if match else "llm"


def yield_lines(db: Path) -> list[str]:
    """``valid_variant_yield_<source>`` over every campaign in ``db``: verified (or improved)
    variants over proposals that left the funnel, the original left out; LLM proposals per
    model (``valid_variant_yield_smollm2``).  Then ``inference_share`` per model over the
    campaigns that asked it: LLM time over campaign wall time (generation and evaluation)."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import VariantOrigin, VariantStatus
    from r3tui.engine.report import build_report

    counts: dict[str, list[int]] = {}
    shares: dict[str, list[float]] = {}
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        for c in repo.list_campaign_summaries(s):
            calls = dict(repo.campaign_llm_calls(s, c.id))
            for v in repo.campaign_variants(s, c.id):
                if v.origin is VariantOrigin.SEED or v.status is VariantStatus.PENDING:
                    continue
                call = calls.get(v.llm_call_id) if v.llm_call_id is not None else None
                source = model_tag(call.model_path) if call is not None else v.origin.value
                row = counts.setdefault(source, [0, 0, 0])
                row[0] += 1
                row[1] += v.status in (VariantStatus.VERIFIED, VariantStatus.IMPROVED)
                row[2] += v.status is VariantStatus.IMPROVED
            models = {model_tag(call.model_path) for call in calls.values()}
            split = build_report(s, c.id).time_split if len(models) == 1 else {}
            if split.get("wall_s", 0.0) > 0:
                share = shares.setdefault(models.pop(), [0.0, 0.0])
                share[0] += split["llm_s"]
                share[1] += split["wall_s"]
    lines = [
        f"valid_variant_yield_{origin}: {ok / n if n else 0:.3f}  ({ok}/{n} verified, "
        f"{better} improved)"
        for origin, (n, ok, better) in sorted(counts.items())
    ]
    if shares:
        llm_all, wall_all = (sum(v[i] for v in shares.values()) for i in (0, 1))
        lines.append(f"inference_share: {min(1.0, llm_all / wall_all):.3f}  (every LLM campaign)")
    lines += [
        f"inference_share_{model}: {min(1.0, llm / wall):.3f}  (LLM {llm:.0f} s of {wall:.0f} s "
        "campaign wall, generation and evaluation)"
        for model, (llm, wall) in sorted(shares.items())
    ]
    return lines


def climb_lines(db: Path) -> list[str]:
    """``climbs[<example>]`` over the r3 searches in ``db``: how many children climbed from
    their best (engine.lineage.Climb), in how many seeds, the trials the climbs took and
    their share of the r3 searches' trials, and the climb that gained most (its child's best
    before and after)."""
    from db import repository as repo
    from db.session import open_database
    from r3tui.engine.report import build_report

    per: dict[str, list[tuple[Climbs, int]]] = {}  # example -> its r3 searches' climbs, trials
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        for c in repo.list_campaign_summaries(s):
            match = _NAME.match(c.name)
            if match is not None and match["kind"] == "r3":
                per.setdefault(match["example"], []).append(
                    (build_report(s, c.id).climbs, c.n_trials))
    lines = []
    for example, searches in sorted(per.items()):
        children = sum(climbs.children for climbs, _ in searches)
        climbed = sum(climbs.children > 0 for climbs, _ in searches)
        added = sum(climbs.trials for climbs, _ in searches)
        trials = sum(n for _, n in searches)
        best = max((g for climbs, _ in searches if (g := climbs.best_gain) is not None),
                   key=lambda g: g[1] / g[2], default=None)
        share = added / trials if trials else 0.0
        most = (f"; most gained {best[1] / best[2]:.3f}x (variant #{best[0]}, "
                f"{best[1] * 1e6:.1f} -> {best[2] * 1e6:.1f} us)" if best else "")
        lines.append(f"climbs[{example}]: {children} {'child' if children == 1 else 'children'} "
                     f"in {climbed} of {len(searches)} r3 searches, {added} trials "
                     f"({share:.1%} of theirs){most}")
    return lines
