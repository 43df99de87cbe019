"""Campaign and search settings declared once (engine/options.py): r3 tune's flags, their
defaults and help, and r3.toml's [campaign] and [search] sections all come from the fields
of CampaignSettings and InnerSettings."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

import pytest

from r3tui.cli import build_parser
from r3tui.cli.campaign_options import campaign_settings
from r3tui.config import load_settings
from r3tui.engine.campaign import CampaignSettings
from r3tui.engine.inner import InnerSettings
from r3tui.engine.options import user_fields
from tests.unit.test_bundle import write_bundle
from tests.unit.test_bundle_commands import r3


def _tune_args(argv: list[str], project: Path) -> argparse.Namespace:
    args = build_parser().parse_args(["tune", "b", *argv])
    args.settings = load_settings(project_dir=project, user_file=project / "none.toml")
    return args


def test_every_user_setting_has_one_flag_whose_help_shows_the_dataclass_default() -> None:
    parser = build_parser()
    tune = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
                if isinstance(a, argparse._SubParsersAction)).choices["tune"]
    text = tune.format_help().replace("\n", " ")
    flags = [opt.flag for cls in (CampaignSettings, InnerSettings) for _f, opt in
             user_fields(cls)]
    assert len(flags) == len(set(flags)) >= 12
    for cls in (CampaignSettings, InnerSettings):
        for f, opt in user_fields(cls):
            assert opt.flag in text, opt.flag
            if not isinstance(f.default, bool):
                assert f"(default: {f.default})" in " ".join(text.split()), f.name
    # the flags with a dataclass field are no other settings' fields
    assert {f.name for f in fields(CampaignSettings)} & {"strategy", "bayes"} == set()


def test_flags_then_r3_toml_then_the_defaults(tmp_path: Path) -> None:
    defaults = campaign_settings(_tune_args([], tmp_path), 5, None)
    assert defaults.llm_share == CampaignSettings().llm_share == 0.75  # one default
    assert defaults.inner.batch == InnerSettings().batch and defaults.repair is False
    (tmp_path / "r3.toml").write_text(
        "[campaign]\nislands = 3\nllm_share = 1\nrepair = true\n"
        "[search]\nestimator = \"RF\"\nbatch = 4\n")
    from_file = campaign_settings(_tune_args([], tmp_path), 5, None)
    assert (from_file.islands, from_file.llm_share, from_file.repair) == (3, 1.0, True)
    assert (from_file.inner.estimator, from_file.inner.batch) == ("RF", 4)
    flagged = campaign_settings(_tune_args(["--islands", "4", "--batch", "2",
                                             "--rules-only"], tmp_path), 5, None)
    assert (flagged.islands, flagged.inner.batch, flagged.llm_share) == (4, 2, 0.0)
    (tmp_path / "r3.toml").unlink()
    assert campaign_settings(_tune_args(["--repair"], tmp_path), 5, None).repair is True
    assert flagged.inner.estimator == "RF"  # not given on the command line: the file's


@pytest.mark.parametrize(("table", "message"), [
    ("[campaign]\ncolour = 1\n", "unknown key campaign.colour (known: "),
    ("[search]\nbatch = \"many\"\n", "search.batch must be int, not str"),
    ("[search]\nstrategy = \"annealing\"\n", "search.strategy must be one of bayes, "),
    ("[campaign]\nislands = true\n", "campaign.islands must be int, not bool"),
])
def test_a_bad_r3_toml_setting_is_one_line_naming_the_file(
        tmp_path: Path, table: str, message: str) -> None:
    (tmp_path / "r3.toml").write_text(table)
    bundle = write_bundle(tmp_path / "b")
    db = tmp_path / "r3.sqlite"
    result = r3("tune", str(bundle.path), "--inner-only", "--budget", "2", "--db", str(db),
                cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert message in line and "r3.toml" in line, line
    assert not db.exists()


def test_where_candidates_run_comes_from_flags_then_the_runner_section(tmp_path: Path) -> None:
    from r3tui.cli.campaign_options import runner_settings
    from r3tui.engine.gpu import RunnerSettings
    from r3tui.errors import R3Error

    assert runner_settings(_tune_args([], tmp_path)) == RunnerSettings()
    (tmp_path / "r3.toml").write_text(
        "[runner]\nrunner = \"dask\"\nworkers = 6\njobqueue = \"slurm\"\nqueue = \"gpu\"\n"
        "walltime = \"01:00:00\"\n")
    from_file = runner_settings(_tune_args([], tmp_path))
    assert (from_file.runner, from_file.workers, from_file.scheduler) == ("dask", 6, "")
    # keys that are not flags are dask-jobqueue's, with jobqueue
    assert from_file.jobqueue == {"jobqueue": "slurm", "queue": "gpu", "walltime": "01:00:00"}
    flagged = runner_settings(_tune_args(["--workers", "2", "--scheduler", "tcp://h:8786"],
                                         tmp_path))
    assert (flagged.runner, flagged.workers, flagged.scheduler) == ("dask", 2, "tcp://h:8786")
    (tmp_path / "r3.toml").write_text("[runner]\nqueue = \"gpu\"\n")
    with pytest.raises(R3Error, match=r"unknown key runner.queue .*r3.toml|r3.toml.*runner.queue"):
        runner_settings(_tune_args([], tmp_path))
    (tmp_path / "r3.toml").write_text("")
    with pytest.raises(R3Error, match="--scheduler needs --runner dask"):
        runner_settings(_tune_args(["--scheduler", "tcp://h:8786"], tmp_path))


@pytest.mark.parametrize("command", [["tune", "b"], ["tune-app", "rec"], ["evaluate"]])
def test_every_campaign_command_takes_the_runner_flags(command: list[str]) -> None:
    args = build_parser().parse_args([*command, "--runner", "dask", "--workers", "3",
                                      "--gpus", "2", "--scheduler", "tcp://h:8786"])
    assert (args.runner, args.workers, args.gpus, args.scheduler) == (
        "dask", 3, 2, "tcp://h:8786")


def test_a_no_flag_turns_its_setting_off_and_any_other_turns_it_on(tmp_path: Path) -> None:
    """Each bool flag as parsed: ``--no-x`` gives False (its field is on by default), any
    other gives True; unset, the dataclass default holds (``--no-check-names`` once set its
    field True, as every unset flag left it)."""
    for cls in (CampaignSettings, InnerSettings):
        for f, opt in user_fields(cls):
            if not isinstance(f.default, bool):
                continue
            wanted = not opt.flag.startswith("--no-")
            settings = campaign_settings(_tune_args([opt.flag], tmp_path), None, None)
            where = settings if cls is CampaignSettings else settings.inner
            assert getattr(where, f.name) is wanted, opt.flag
            unset = campaign_settings(_tune_args([], tmp_path), None, None)
            assert getattr(unset if cls is CampaignSettings else unset.inner, f.name) is f.default
