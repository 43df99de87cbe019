from pathlib import Path

import pytest

from r3tui.config import load_settings, resolve_db_path
from r3tui.errors import ConfigError


def test_defaults_without_any_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("R3_DB", raising=False)
    settings = load_settings(project_dir=tmp_path, user_file=tmp_path / "none.toml")
    assert settings.db.path == Path("r3.sqlite")
    assert settings.compile.toolchain == "nvrtc"
    assert settings.sources == ()


def test_project_file_overrides_user_file_and_env_overrides_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("R3_DB", raising=False)
    user = tmp_path / "user.toml"
    user.write_text('[db]\npath = "/data/user.sqlite"\n[compile]\ntoolchain = "nvcc"\n')
    project = tmp_path / "proj"
    project.mkdir()
    (project / "r3.toml").write_text('[db]\npath = "runs/project.sqlite"\n')
    settings = load_settings(project_dir=project, user_file=user)
    # relative paths in a config file are relative to that file
    assert settings.db.path == project / "runs/project.sqlite"
    assert settings.compile.toolchain == "nvcc"
    assert settings.sources == (user, project / "r3.toml")

    monkeypatch.setenv("R3_DB", str(tmp_path / "env.sqlite"))
    settings = load_settings(project_dir=project, user_file=user)
    assert settings.db.path == tmp_path / "env.sqlite"
    assert resolve_db_path("flag.sqlite", settings) == Path("flag.sqlite")
    assert resolve_db_path(None, settings) == tmp_path / "env.sqlite"


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[db\n", "not valid TOML"),
        ("[nope]\nx = 1\n", "unknown section [nope]"),
        ("[db]\ncolour = 1\n", "unknown key db.colour"),
        ("[db]\npath = 3\n", "db.path must be a string"),
        ("[compile]\ntoolchain = 3\n", "compile.toolchain must be a string"),
        # keys documented once and never read are unknown now
        ("[compile]\narch = \"sm_80\"\n", "unknown key compile.arch"),
        ("[db]\nbusy_timeout_s = 5\n", "unknown key db.busy_timeout_s"),
    ],
)
def test_bad_config_files_name_the_problem(tmp_path: Path, text: str, fragment: str) -> None:
    (tmp_path / "r3.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(project_dir=tmp_path, user_file=tmp_path / "none.toml")
    assert fragment in str(info.value)
