"""Settings: nested frozen dataclasses read from ``r3.toml`` and the user config file.

Precedence, highest first: command-line flags, environment variables (``R3_DB``,
``R3_MODEL``), ``./r3.toml`` (the project), ``~/.config/r3/config.toml`` (the user, located
with platformdirs), then the defaults below.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from r3tui.errors import ConfigError

DEFAULT_DB = Path("r3.sqlite")
PROJECT_CONFIG = Path("r3.toml")


# Only keys something reads: [compile] arch and cache_dir and [db] busy_timeout_s were
# documented and never read (the GPU's own architecture is compiled for, the cache is the
# user cache directory, the busy timeout db.session's default), so they are gone.
@dataclass(frozen=True)
class DatabaseSettings:
    path: Path = field(default=DEFAULT_DB, metadata={"help": "experiment database file"})


@dataclass(frozen=True)
class CompileSettings:
    toolchain: str = field(default="nvrtc", metadata={"help": "nvrtc | nvcc | llvm"})


@dataclass(frozen=True)
class ModelSettings:
    path: Path | None = field(default=None, metadata={"help": "GGUF model file"})


@dataclass(frozen=True)
class Settings:
    db: DatabaseSettings = field(default_factory=DatabaseSettings)
    compile: CompileSettings = field(default_factory=CompileSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    sources: tuple[Path, ...] = ()  # config files that were read, for `r3 doctor`
    # [campaign], [search] and [runner]: defaults for the flags of r3 tune and r3 tune-app,
    # keyed by the fields of CampaignSettings, InnerSettings and RunnerSettings (checked
    # there: engine.options; [runner] also takes dask-jobqueue's keys), each with the file it
    # came from
    tables: tuple[tuple[str, str, object, Path], ...] = ()

    def table(self, section: str) -> tuple[dict[str, object], Path | None]:
        """A ``[campaign]``, ``[search]`` or ``[runner]`` section, later files over earlier
        ones, and the last file that set any of it."""
        values: dict[str, object] = {}
        origin = None
        for name, key, value, path in self.tables:
            if name == section:
                values[key] = value
                origin = path
        return values, origin


# sections of r3.toml whose keys the engine checks against its settings dataclasses
FLAG_TABLES = ("campaign", "search", "runner")


def user_config_path() -> Path:
    from platformdirs import user_config_dir

    return Path(user_config_dir("r3", appauthor=False)) / "config.toml"


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc


def _merge_section(current: Any, section: str, values: Any, origin: Path) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{origin}: [{section}] must be a table")
    known = {f.name: f for f in fields(current)}
    updates: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(
                f"{origin}: unknown key {section}.{key} (known: {', '.join(sorted(known))})"
            )
        default = getattr(current, key)
        if isinstance(default, Path) or key == "path":
            if not isinstance(value, str):
                raise ConfigError(f"{origin}: {section}.{key} must be a string path")
            path = Path(value).expanduser()
            updates[key] = path if path.is_absolute() else origin.parent / path
        else:
            if not isinstance(value, str):
                raise ConfigError(f"{origin}: {section}.{key} must be a string")
            updates[key] = value
    return replace(current, **updates)


def apply_file(settings: Settings, path: Path) -> Settings:
    data = _read_toml(path)
    sections = {f.name for f in fields(settings) if f.name not in ("sources", "tables")}
    for section, values in data.items():
        if section in FLAG_TABLES:
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: [{section}] must be a table")
            settings = replace(settings, tables=(
                *settings.tables, *((section, k, v, path) for k, v in values.items())))
            continue
        if section not in sections:
            known = ", ".join(sorted((*sections, *FLAG_TABLES)))
            raise ConfigError(f"{path}: unknown section [{section}] (known: {known})")
        settings = replace(
            settings, **{section: _merge_section(getattr(settings, section), section, values, path)}
        )
    return replace(settings, sources=(*settings.sources, path))


def load_settings(*, project_dir: Path | None = None, user_file: Path | None = None) -> Settings:
    """Defaults, then the user file, then the project file, then the environment."""
    settings = Settings()
    user = user_file if user_file is not None else user_config_path()
    if user.is_file():
        settings = apply_file(settings, user)
    project = (project_dir or Path.cwd()) / PROJECT_CONFIG
    if project.is_file():
        settings = apply_file(settings, project)
    if env_db := os.environ.get("R3_DB"):
        settings = replace(settings, db=replace(settings.db, path=Path(env_db).expanduser()))
    if env_model := os.environ.get("R3_MODEL"):
        settings = replace(
            settings, model=replace(settings.model, path=Path(env_model).expanduser())
        )
    return settings


def resolve_db_path(flag: str | None, settings: Settings) -> Path:
    """``--db`` wins over everything else."""
    return Path(flag).expanduser() if flag else settings.db.path
