"""``r3 tune-app RECORDING_DIR``: tune the kernels that dominate an application's GPU time
(the ranking and the campaigns are :mod:`r3tui.engine.application`'s, the prediction
:mod:`r3tui.engine.prediction`'s)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from r3tui.cli.campaign_options import (
    add_campaign_options,
    backend_spec,
    campaign_settings,
    inner_settings,
    parse_budget,
    runner_settings,
)
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.cli import Subcommands


def _cmd_tune_app(args: argparse.Namespace) -> int:
    from r3tui.engine.application import (
        PLAN_FILE,
        campaign_tuner,
        inner_tuner,
        load_recording,
        outcome_lines,
        prediction_lines,
        render_ranking,
        tune_app,
    )

    recording = load_recording(args.recording)
    parse_budget(args.budget)  # a bad budget fails before anything runs
    if args.top < 1:
        raise R3Error("--top must be at least 1")
    if args.check_configs < 0:
        raise R3Error("--check-configs must be 0 or more")
    for line in render_ranking(recording, args.top):
        print(line)
    if args.plan:
        return 0
    count, seconds = parse_budget(args.budget)
    if args.inner_only:
        tuner = inner_tuner(Path(args.db), count, seconds, lambda: inner_settings(args),
                            runner_settings(args))
    else:
        tuner = campaign_tuner(Path(args.db), count, seconds,
                               lambda: campaign_settings(args, count, seconds),
                               backend_spec(args), runner_settings(args))
    from r3tui.engine.transfer import GpuChecker

    checker = GpuChecker(Path(args.db), recording.path) if args.check_configs else None
    result = tune_app(recording, Path(args.db), args.budget, args.top, tuner, checker,
                      args.check_configs)
    for k in result.kernels:
        for line in outcome_lines(k):
            print(line)
    for line in prediction_lines(result.kernel_time_speedup, result.app_wall_speedup,
                                 result.kernel_time_s, result.wall_s, result.other_work):
        print(line)
    print(f"campaigns written to {recording.path / PLAN_FILE}")
    return 0


def add_commands(sub: Subcommands) -> None:
    from r3tui.engine.transfer import MAX_CHECKS

    tune_app_parser = sub.add_parser(
        "tune-app", help="tune the kernels that dominate a recorded application's GPU time"
    )
    tune_app_parser.add_argument(
        "recording", type=Path, help="directory written by `r3 record --out DIR -- ./app`"
    )
    tune_app_parser.add_argument(
        "--budget", default="20",
        help="per kernel: variants (20) or wall time (90s, 10m); trials with --inner-only"
    )
    tune_app_parser.add_argument("--top", type=int, default=3,
                                 help="kernels to tune, by device time (default: 3)")
    tune_app_parser.add_argument(
        "--inner-only", action="store_true",
        help="only Bayesian optimization of options and launch settings, no source search")
    tune_app_parser.add_argument(
        "--check-configs", type=int, default=MAX_CHECKS, metavar="N",
        help="re-time each winner on up to N other recorded configurations of its kernel, "
             f"for the prediction and to refuse one that is wrong there (default {MAX_CHECKS}; "
             "0: take the tuned configuration's speedup for all)")
    add_campaign_options(tune_app_parser)
    tune_app_parser.add_argument(
        "--plan", action="store_true", help="only print the ranking; touch no GPU"
    )
    tune_app_parser.set_defaults(handler=_cmd_tune_app)
