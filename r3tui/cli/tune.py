"""``r3 tune`` and ``r3 evaluate``: the campaign commands, with rich progress on stderr."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.cli.campaign_options import (
    add_campaign_options,
    add_runner_options,
    backend_spec,
    campaign_settings,
    inner_settings,
    parse_budget,
    runner_settings,
)
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.cli import Subcommands
    from r3tui.engine.campaign import StepReport
    from r3tui.engine.inner import InnerResult
    from r3tui.search import InnerSearch


@contextmanager
def _bar(total: int | None, description: str) -> Iterator[tuple[Any, Any]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        yield bar, bar.add_task(description, total=total, note="")


def _tune_inner_only(args: argparse.Namespace) -> int:
    from rich.console import Console

    from r3tui.engine import InnerCampaign, run_inner_campaign
    from r3tui.record.bundle import Bundle

    if args.bundle is None:
        raise R3Error("--inner-only needs the recording bundle")
    trials, seconds = parse_budget(args.budget)
    Bundle.open(args.bundle)  # a bad path fails here, in one line, before any progress bar
    job = InnerCampaign(
        args.bundle,
        args.db,
        trials,
        seconds,
        inner_settings(args),
        resume_campaign=args.resume,
        name=args.name,
        runner=runner_settings(args),
    )
    with _bar(trials, "tuning") as (bar, task):

        def show(search: InnerSearch) -> None:
            best = search.best()
            note = f"best {best[1] * 1e6:.2f} µs" if best else "no success yet"
            bar.update(task, completed=search.n_evaluated, note=note)

        result = run_inner_campaign(job, show)
    out = Console(highlight=False)
    for line in inner_summary_lines(result):
        out.print(line, markup=False)
    return 0 if result.winner is not None else 1


def inner_summary_lines(result: InnerResult) -> list[str]:
    """What ``r3 tune --inner-only`` prints: the trials, the winner, and the campaign id
    that ``r3 report`` and ``r3 apply`` take (worded as a remix campaign's last line)."""
    lines = list(result.launch_notes)  # which block shapes were searched, or why none
    failures = ", ".join(f"{n} {k}" for k, n in sorted(result.failures.items()))
    lines.append(f"trials: {result.trials}" + (f" ({failures})" if failures else ""))
    w = result.winner
    if w is None:
        lines.append("no configuration measured successfully")
    else:
        lines += [
            f"baseline: {w.baseline_median_s * 1e6:.2f} µs (recorded configuration, re-timed)",
            f"winner: {w.best.median_s * 1e6:.2f} µs, speedup {w.speedup:.3f}x "
            f"[{w.best.low:.3f}, {w.best.high:.3f}] over {w.rounds} interleaved rounds"
            + ("" if w.best.significant else " (not beyond the noise)"),
            f"config: {w.config.to_json()}",
        ]
    if result.campaign_id is not None:
        cid = result.campaign_id
        lines.append(f"campaign {cid}: {result.trials} trial(s), inner-only; see "
                     f"`r3 report {cid}`" + (f", or `r3 apply {cid} --into DIR` for an "
                                             "application's kernel" if w is not None else ""))
    return lines


def _show_steps(bar: Any, task: Any) -> Any:
    best: list[float] = []

    def show(step: StepReport) -> None:
        if step.best_s is not None and step.status.value in ("verified", "improved"):
            best.append(step.best_s)
        note = f"#{step.variant_id} {step.operator} → {step.status.value}"
        if best:
            note += f" · best {min(best) * 1e6:.2f} µs"
        bar.update(task, advance=0 if step.index < 0 else 1, note=note)

    return show


def _cmd_tune(args: argparse.Namespace) -> int:
    from rich.console import Console

    from r3tui.engine.tune import CampaignJob, run_campaign

    if args.inner_only:
        return _tune_inner_only(args)
    if args.replay_llm is not None:
        from r3tui.engine.replay_llm import replay_campaign

        with _bar(None, "re-running") as (bar, task):
            outcome = replay_campaign(
                args.db, args.replay_llm, args.bundle, progress=_show_steps(bar, task),
                runner_settings=runner_settings(args), generate_only=args.generate_only,
            )
        done = ("re-made, pending; `r3 evaluate --campaign "
                f"{outcome.campaign_id}` measures them on a GPU" if args.generate_only
                else "re-run")
        Console(highlight=False).print(
            f"campaign {outcome.campaign_id}: {outcome.proposals} variants {done} from "
            f"campaign {args.replay_llm}'s recorded LLM answers ({outcome.status})"
        )
        return 0
    if args.bundle is None and args.resume is None:
        raise R3Error("give the recording bundle (or --resume CAMPAIGN)")
    variants, seconds = parse_budget(args.budget)
    if args.bundle is not None:
        from r3tui.record.bundle import Bundle

        Bundle.open(args.bundle)
    settings = campaign_settings(args, variants, seconds)
    if args.resume is not None and _stored_llm_share(args.db, args.resume) == 0:
        args.rules_only = True  # a rules-only campaign resumes without a model
    job = CampaignJob(
        args.bundle,
        args.db,
        settings,
        backend_spec(args),
        resume_campaign=args.resume,
        name=args.name,
        runner=runner_settings(args),
    )
    generate = variants if args.generate_only else None
    if args.generate_only and variants is None:
        raise R3Error("--generate-only needs a count for --budget (how many variants to write)")
    with _bar(variants, "generating" if generate else "remixing") as (bar, task):
        outcome = run_campaign(job, _show_steps(bar, task), generate_only=generate)
    for note in outcome.notes:
        Console(highlight=False).print(note)
    Console(highlight=False).print(
        f"campaign {outcome.campaign_id}: {outcome.proposals} variant(s), {outcome.status}; "
        f"see `r3 report {outcome.campaign_id}`"
        + (
            f", then `r3 evaluate --campaign {outcome.campaign_id}` on a GPU node"
            if generate
            else ""
        )
    )
    return 0


def _stored_llm_share(db: Path, campaign_id: int) -> float | None:
    from db import repository as repo
    from db.session import open_database

    with (
        open_database(db, readonly=True, create=False) as database,
        database.session_scope() as s,
    ):
        campaign = repo.get_campaign(s, campaign_id)
    if campaign is None:
        raise R3Error(f"no campaign {campaign_id} in {db}", hint="list them: `r3 runs`")
    share = campaign.settings.get("llm_share")
    return float(share) if share is not None else None


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Variant, VariantStatus
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.tune import CampaignJob, run_campaign

    with (
        open_database(args.db, readonly=True, create=False) as database,
        database.session_scope() as s,
    ):
        def pending_of(campaign_id: int) -> list[Variant]:
            return [
                v
                for v in repo.campaign_variants(s, campaign_id)
                if v.status is VariantStatus.PENDING
            ]

        if args.campaign is None:
            remix = [
                c.id
                for c in repo.list_campaign_summaries(s)
                if (camp := repo.get_campaign(s, c.id)) and camp.settings.get("mode") == "remix"
            ]
            if not remix:
                raise R3Error(f"no remix campaign in {args.db}")
            # the latest remix campaign that has something to evaluate: a rules campaign run
            # after a --generate-only one must not hide the proposals waiting in it
            args.campaign = next((cid for cid in reversed(remix) if pending_of(cid)), remix[-1])
        pending = pending_of(args.campaign)
    job = CampaignJob(args.bundle, args.db, CampaignSettings(), None, resume_campaign=args.campaign,
                      runner=runner_settings(args))
    with _bar(len(pending), "evaluating") as (bar, task):
        outcome = run_campaign(job, _show_steps(bar, task), evaluate_only=True)
    Console(highlight=False).print(
        f"campaign {outcome.campaign_id}: {outcome.proposals} pending variant(s) evaluated"
    )
    return 0


def add_commands(sub: Subcommands) -> None:
    tune = sub.add_parser("tune", help="remix and tune a recorded kernel (or --inner-only)")
    tune.add_argument("bundle", type=Path, nargs="?", help="recording bundle directory")
    tune.add_argument(
        "--inner-only",
        action="store_true",
        help="only Bayesian optimization of options/launch/tunables, no remix",
    )
    tune.add_argument(
        "--budget",
        default="20",
        help="variants (20) or wall time (90s, 10m, 1h); trials with --inner-only",
    )
    add_campaign_options(tune)
    tune.add_argument(
        "--generate-only",
        action="store_true",
        help="write pending variants without a GPU (then `r3 evaluate`)",
    )
    tune.add_argument(
        "--replay-llm",
        type=int,
        metavar="CAMPAIGN",
        help="re-run CAMPAIGN from its recorded LLM answers, no model loaded (with "
        "--generate-only: re-make its tree without a GPU, pending)",
    )
    tune.add_argument("--name", help="campaign name")
    tune.add_argument(
        "--resume",
        type=int,
        metavar="CAMPAIGN",
        help="continue a killed or stopped campaign from the database",
    )
    tune.set_defaults(handler=_cmd_tune)

    evaluate = sub.add_parser("evaluate", help="evaluate a campaign's pending variants on this GPU")
    evaluate.add_argument(
        "--campaign",
        type=int,
        help="campaign id (default: the latest remix campaign with pending variants)",
    )
    evaluate.add_argument(
        "--bundle", type=Path, help="the recording on this node (default: the stored path)"
    )
    add_runner_options(evaluate)
    evaluate.set_defaults(handler=_cmd_evaluate)
