"""The options of a campaign, shared by ``r3 tune`` and ``r3 tune-app``: the model, the
budget, and the campaign's and search's settings, whose flags come from their dataclasses
(:mod:`r3tui.engine.options`) and are resolved against ``r3.toml``'s ``[campaign]`` and
``[search]`` sections, which are checked there too."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.gpu import RunnerSettings
    from r3tui.engine.inner import InnerSettings
    from r3tui.remix.backends import BackendSpec


def parse_budget(text: str) -> tuple[int | None, float | None]:
    """``50`` (a count) or ``90s`` / ``10m`` / ``1h`` (wall time)."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    try:
        if text and text[-1] in units:
            seconds = float(text[:-1]) * units[text[-1]]
            if seconds > 0:
                return None, seconds
        elif int(text) > 0:
            return int(text), None
    except ValueError:
        pass
    raise R3Error(f"bad --budget {text!r}: give a count (50) or a time (90s, 10m, 1h)")


def _table(args: argparse.Namespace, cls: type, section: str) -> dict[str, Any]:
    """The ``r3.toml`` section ``section`` for the settings ``cls``, checked."""
    from r3tui.engine.options import check_table

    settings = getattr(args, "settings", None)
    if settings is None:
        return {}
    table, origin = settings.table(section)
    check_table(cls, section, table, origin)
    return table


def _seed(args: argparse.Namespace) -> int:
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.options import resolve

    return int(resolve(CampaignSettings, args, _table(args, CampaignSettings, "campaign"))["seed"])


def inner_settings(args: argparse.Namespace, seed: int | None = None) -> InnerSettings:
    """The search's settings; ``seed``: the campaign's, where the caller resolved it."""
    from r3tui.engine import InnerSettings
    from r3tui.engine.inner import bayes_settings
    from r3tui.engine.options import resolve

    settings = InnerSettings(
        **resolve(InnerSettings, args, _table(args, InnerSettings, "search")),
        seed=_seed(args) if seed is None else seed,
        toolchain=args.toolchain or args.settings.compile.toolchain,
    )
    bayes_settings(settings)  # a bad --bo fails here, in one line, before any work
    return settings


def runner_settings(args: argparse.Namespace) -> RunnerSettings:
    """Where candidates run: the flags, else ``r3.toml``'s ``[runner]`` section, whose keys
    other than the flags' are dask-jobqueue's (allowed with ``jobqueue``)."""
    from r3tui.engine.gpu import RunnerSettings
    from r3tui.engine.options import check_table, resolve, user_fields

    settings = getattr(args, "settings", None)
    table, origin = settings.table("runner") if settings is not None else ({}, None)
    known = {f.name for f, _ in user_fields(RunnerSettings)}
    mine = {k: v for k, v in table.items() if k in known}
    rest = {k: v for k, v in table.items() if k not in known}
    if rest and "jobqueue" not in rest:
        check_table(RunnerSettings, "runner", table, origin)  # names the unknown key
    check_table(RunnerSettings, "runner", mine, origin)
    values = resolve(RunnerSettings, args, mine)
    if values["scheduler"] and values["runner"] != "dask":
        raise R3Error("--scheduler needs --runner dask")
    return RunnerSettings(**values, jobqueue=rest)


def backend_spec(args: argparse.Namespace) -> BackendSpec | None:
    """The model the campaign talks to, or None for rule mutations only."""
    from r3tui.remix.backends import BackendSpec
    from r3tui.remix.models import resolve_model

    if args.rules_only:
        return None
    if args.llm_url:
        return BackendSpec(kind="http", base_url=args.llm_url, model_name=args.llm_model_name)
    location = resolve_model(args.model, args.settings.model.path)
    return BackendSpec(kind="llama_cpp", model_path=location.path, n_ctx=args.n_ctx)


def campaign_settings(
    args: argparse.Namespace, variants: int | None, seconds: float | None
) -> CampaignSettings:
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.options import resolve

    values = resolve(CampaignSettings, args, _table(args, CampaignSettings, "campaign"))
    if args.rules_only:
        values["llm_share"] = 0.0
    return CampaignSettings(variants=variants, seconds=seconds, **values,
                            inner=inner_settings(args, values["seed"]))


def add_runner_options(parser: argparse.ArgumentParser) -> None:
    """--runner, --workers, --gpus, --scheduler (RunnerSettings; docs/runners.md)."""
    from r3tui.engine.gpu import RunnerSettings
    from r3tui.engine.options import add_options

    add_options(parser, RunnerSettings)


def add_campaign_options(parser: argparse.ArgumentParser) -> None:
    """The options of a campaign (model, mix, archive, inner search, toolchain), shared by
    ``r3 tune`` and ``r3 tune-app``; the settings' flags come from their dataclasses
    (engine.options), where r3.toml's [campaign] and [search] sections are checked too."""
    from r3tui.engine.campaign import CampaignSettings
    from r3tui.engine.inner import InnerSettings
    from r3tui.engine.options import add_options

    add_runner_options(parser)
    parser.add_argument(
        "--model",
        type=Path,
        help="GGUF model file (default: R3_MODEL, config, then the bundled SmolLM2)",
    )
    parser.add_argument("--llm-url", help="OpenAI-compatible server instead of a local model")
    parser.add_argument("--llm-model-name", help="model id on that server")
    parser.add_argument("--n-ctx", type=int, default=4096, help="llama.cpp context length")
    parser.add_argument(
        "--rules-only",
        action="store_true",
        help="deterministic rule mutations only, no language model",
    )
    add_options(parser, CampaignSettings)
    add_options(parser, InnerSettings)
    parser.add_argument(
        "--toolchain",
        choices=("nvrtc", "nvcc", "llvm"),
        help="compiler (default: [compile] toolchain, nvrtc)",
    )
