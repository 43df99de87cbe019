"""What an application recording holds: ``RECORDING_DIR/recording.json`` read and checked.

``r3 record -- ./app`` writes every kernel the application launched, with its launch counts,
device time and one bundle per recorded launch configuration.  Here that file becomes an
:class:`AppRecording` (kernels by their share of all kernel device time, each with its
configurations), which tune-app ranks and tunes (:mod:`r3tui.engine.application`); the replay
workers ask it for a bundle's in-app time and launch limits; and ``r3 apply`` reads from it
each campaign's share, entry point and the application's directory (:class:`RecordingContext`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3tui.domain import LaunchTimes, other_launches_differ
from r3tui.errors import R3Error

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

RECORDING_FILE = "recording.json"
# A kernel whose scalar arguments change on every launch (CG's update_xr takes this
# iteration's alpha) has one same-args launch: the recorded one, timed right after the
# snapshot's synchronization.  One such sample is no mean to set a replay against; the mean
# over every launch, which differs from it only in scalar values, is the better figure.
MIN_SAME_ARGS_TIMED = 2


@dataclass(frozen=True)
class RecordedConfig:
    """One launch configuration of one kernel, as the application ran it."""

    entry_point: str
    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    count: int
    device_time_s: float
    bundle: Path | None
    replayable: bool
    reasons: tuple[str, ...]
    share: float = 0.0  # of all kernels' device time
    # the launches whose arguments equal the recorded (replayed) launch's; None in recordings
    # made before the interposer counted them, or where it kept no argument bytes
    same_args: LaunchTimes | None = None
    # a later stratum of its grid and block (r3 record --strata): the launch number, among
    # that grid and block's launches, it began at; 1 for the first (and every older recording)
    from_launch: int = 1

    def in_app_time(self) -> tuple[float, str]:
        """Device time per launch in the application, to set a replay against, and which mean
        it is: over the launches with the recorded arguments (``"same args"``, what a replay
        reproduces) where the recording has at least ``MIN_SAME_ARGS_TIMED`` of them, else
        over every launch (``"all"``)."""
        same = self.same_args
        if same is not None and same.mean_s is not None and same.timed >= MIN_SAME_ARGS_TIMED:
            return same.mean_s, "same args"
        return self.device_time_s / max(1, self.count), "all"

    def other_work(self, name: str) -> str | None:
        """Why a speedup replayed on this configuration may not hold for its launches: where
        the launches whose arguments differ from the replayed launch's took, on average,
        more or less device time than it (:func:`~r3tui.domain.other_launches_differ`),
        they do other work (sizes, offsets or steps the arguments set), and a change can
        gain there what it does not gain on the replayed launch.  None where they took about
        as long (pointer arguments that swap, as in a double-buffered loop), or the
        recording cannot say.

        gaussian's Fan2 (H100, session 45): one configuration, 4095 launches, each with the
        elimination step as an argument; the replayed first launch does the most work, and
        the winner's 10.9x there became 20.0x over all launches, where most threads of the
        later steps do nothing and the launch's shape decides."""
        differ = other_launches_differ(self.count, self.device_time_s, self.same_args)
        if differ is None or self.same_args is None:
            return None
        others, replayed = differ
        return (f"{name}: the replayed launch's arguments recur in {self.same_args.count} of "
                f"the {self.count} launches of its configuration, and the others took "
                f"{others * 1e6:.1f} us a launch against its {replayed * 1e6:.1f} us: they "
                "do other work, which the prediction takes to gain what the replayed launch "
                "gains, so it may be far off (`r3 record --strata-from` this recording "
                "records them as strata, whose gains the prediction then counts)")


@dataclass(frozen=True)
class KernelShare:
    entry_point: str
    name: str
    launches: int
    device_time_s: float
    share: float
    configs: tuple[RecordedConfig, ...]  # largest device time first
    unit: str | None = None  # the translation unit it was recorded from (its path)

    @property
    def most_threads(self) -> int:
        """The most threads per block the application launches the kernel with, over every
        recorded configuration: an injected ``__launch_bounds__`` below it would make those
        launches fail."""
        return max(c.block[0] * c.block[1] * c.block[2] for c in self.configs)

    @property
    def target(self) -> RecordedConfig | None:
        """The configuration to tune: the replayable one with the most device time."""
        for config in self.configs:
            if config.replayable and config.bundle is not None:
                return config
        return None


@dataclass(frozen=True)
class AppRecording:
    path: Path
    command: tuple[str, ...]
    cwd: Path
    runtime: str
    wall_s: float
    kernels: tuple[KernelShare, ...]  # by device time, largest first
    warnings: tuple[str, ...] = ()
    graph_time_s: float = 0.0  # kernels run through CUDA graphs: timed, not recorded

    @property
    def kernel_time_s(self) -> float:
        """All kernel device time: recorded kernels and graph launches."""
        return sum(k.device_time_s for k in self.kernels) + self.graph_time_s


def _field(data: dict[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise R3Error(f"{where}: field {key!r} is missing")
    return data[key]


def _recorded_in(bundle_path: Path) -> tuple[KernelShare, RecordedConfig] | None:
    """The kernel and configuration of an application recording that ``bundle_path`` holds,
    from the ``recording.json`` it lies under (None for a kernel recording)."""
    bundle = Path(bundle_path).resolve()
    directory = bundle.parent.parent
    try:
        content = hashlib.sha256((directory / RECORDING_FILE).read_bytes()).hexdigest()
    except OSError:
        return None
    recording = _recording_as_of(directory, content)
    if recording is None:
        return None
    for kernel in recording.kernels:
        for config in kernel.configs:
            if config.bundle is not None and config.bundle.resolve() == bundle:
                return kernel, config
    return None


@functools.lru_cache(maxsize=8)
def _recording_as_of(directory: Path, content_sha256: str) -> AppRecording | None:
    """``load_recording`` once per content of the file (its hash is the key): each replay
    worker of a campaign and of tune-app's checks asks for its bundle's in-app time and launch
    limits, two reads a worker."""
    try:
        return load_recording(directory)
    except (R3Error, OSError, ValueError):
        return None


def in_app_reference(bundle_path: Path) -> float | None:
    """The application's own device time per launch of the configuration ``bundle_path``
    holds (None for a kernel recording, or where none says): what the replay worker
    calibrates its L2 policy against."""
    found = _recorded_in(bundle_path)
    if found is None:
        return None
    per_launch, _basis = found[1].in_app_time()
    return per_launch if per_launch > 0 else None


def most_threads_launched(bundle_path: Path) -> int:
    """:attr:`KernelShare.most_threads` of the kernel of ``bundle_path`` (0 for a kernel
    recording)."""
    found = _recorded_in(bundle_path)
    return 0 if found is None else found[0].most_threads


def load_recording(directory: Path) -> AppRecording:
    """``directory/recording.json`` read and checked; a bad one is a one-line R3Error."""
    directory = directory.resolve()  # bundle paths go into the database: make them absolute
    path = directory / RECORDING_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise R3Error(
            f"{directory} is not an application recording: no {RECORDING_FILE}",
            hint="record one with `r3 record --out DIR -- ./app ARGS`",
        ) from exc
    except (OSError, ValueError) as exc:
        raise R3Error(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict) or data.get("format_version") != 1:
        raise R3Error(f"{path}: not a format_version 1 application recording")
    where = str(path)
    raw_kernels: list[tuple[str, str, int, float, list[RecordedConfig], str | None]] = []
    try:
        for k in _field(data, "kernels", where):
            entry = str(_field(k, "entry_point", where))
            name = str(k.get("name") or entry)
            configs = [
                RecordedConfig(
                    entry,
                    name,
                    tuple(int(x) for x in _field(c, "grid", where)),  # type: ignore[arg-type]
                    tuple(int(x) for x in _field(c, "block", where)),  # type: ignore[arg-type]
                    int(c.get("count", 0)),
                    float(_field(c, "device_time_s", where)),
                    directory / c["bundle"] if c.get("bundle") else None,
                    bool(c.get("replayable", False)),
                    tuple(str(r) for r in c.get("reasons", ())),
                    same_args=LaunchTimes.from_json(c.get("same_args")),
                    from_launch=int(c.get("from_launch") or 1),
                )
                for c in _field(k, "configs", where)
            ]
            unit = (k.get("source") or {}).get("path")
            raw_kernels.append((entry, name, int(k.get("launches", 0)),
                                float(k["device_time_s"]), configs,
                                str(unit) if unit else None))
    except (TypeError, ValueError, KeyError) as exc:
        raise R3Error(f"{where}: malformed kernel entry ({type(exc).__name__}: {exc})") from exc
    try:
        graph_time = float((data.get("graphs") or {}).get("device_time_s", 0.0))
    except (TypeError, ValueError, AttributeError) as exc:
        raise R3Error(f"{where}: malformed graphs entry ({exc})") from exc
    # Shares are of all kernel device time, graph launches included, so a graph-heavy
    # application's predicted speedup is not overstated.
    total = sum(k[3] for k in raw_kernels) + graph_time
    kernels = [
        KernelShare(
            entry,
            name,
            launches,
            t,
            t / total if total > 0 else 0.0,
            tuple(
                sorted(
                    (_with_share(c, total) for c in configs),
                    key=lambda c: -c.device_time_s,
                )
            ),
            unit,
        )
        for entry, name, launches, t, configs, unit in raw_kernels
    ]
    kernels.sort(key=lambda k: (-k.device_time_s, k.entry_point))
    return AppRecording(
        directory,
        tuple(str(x) for x in data.get("command", ())),
        Path(str(data.get("cwd", directory))),
        str(data.get("runtime", "unknown")),
        float(data.get("wall_s", 0.0)),
        tuple(kernels),
        tuple(str(w) for w in data.get("warnings", ())),
        graph_time,
    )



def _with_share(config: RecordedConfig, total: float) -> RecordedConfig:
    return replace(config, share=config.device_time_s / total if total > 0 else 0.0)


# -- what r3 apply reads from the recording the campaigns came from ------------------------
@dataclass(frozen=True)
class RecordingContext:
    """What the campaigns' ``recording.json`` says: each campaign's share of all kernels'
    device time and its kernel's entry point, the application's directory and command, and
    the recorded run's kernel time and wall time."""

    shares: dict[int, float] | None = None
    entry_points: dict[int, str] = field(default_factory=dict)
    cwd: Path | None = None
    command: tuple[str, ...] = ()
    kernel_time_s: float = 0.0
    wall_s: float = 0.0
    # the most threads per block the application launched each campaign's kernel with (over
    # all its recorded configurations): a __launch_bounds__ below it would fail those launches
    max_threads: dict[int, int] = field(default_factory=dict)
    # where a campaign's configuration's other launches do other work than the replayed one
    # (RecordedConfig.other_work): why its prediction may be far off
    other_work: dict[int, str] = field(default_factory=dict)


# -- shares and the default tree, from the recording the campaigns came from ----------------
def recording_context(s: Session, campaign_ids: list[int]) -> RecordingContext:
    """From the ``recording.json`` beside the campaigns' bundles (no shares where there is
    none)."""
    from db import repository as repo

    shares: dict[int, float] = {}
    entries: dict[int, str] = {}
    threads: dict[int, int] = {}
    other: dict[int, str] = {}
    app = None
    for campaign_id in campaign_ids:
        campaign = repo.get_campaign(s, campaign_id)
        if campaign is None:
            raise R3Error(f"no campaign {campaign_id} in this database", hint="`r3 runs`")
        recording = repo.get_recording(s, campaign.recording_id)
        assert recording is not None
        bundle = Path(recording.bundle_path).resolve()
        directory = bundle.parent.parent
        if not (directory / "recording.json").is_file():
            return RecordingContext(None, entries, app.cwd if app else None,
                                    app.command if app else ())
        app = load_recording(directory)
        for kernel in app.kernels:
            for config in kernel.configs:
                if config.bundle is not None and config.bundle.resolve() == bundle:
                    shares[campaign_id] = kernel.share  # every launch of it (KernelOutcome)
                    entries[campaign_id] = kernel.entry_point
                    threads[campaign_id] = kernel.most_threads
                    caveat = config.other_work(kernel.name)
                    if caveat:
                        other[campaign_id] = caveat
    if app is None:
        return RecordingContext()
    return RecordingContext(shares, entries, app.cwd, app.command, app.kernel_time_s, app.wall_s,
                            threads, other)
