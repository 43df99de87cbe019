"""Kernel Tuner cache files from our recorded spaces, so Kernel Tuner searches the same table.

Kernel Tuner's simulation mode (``tune_kernel(..., cache=FILE, simulation_mode=True)``) answers
every configuration a strategy asks for from a cache file instead of a GPU.  This module turns
one of our recorded spaces (``tests/data/spaces/*.json``, real H200 measurements) into such a
file:

- each of our search dimensions becomes a tunable parameter with the same values in the same
  order (ordinal dimensions: their values, e.g. block.x -> ``block_size_x: [4, 8, ...]``;
  categorical ones: their labels, e.g. ``use_fast_math: ["default", "on"]``);
- each configuration our space enumerates (every valid point; the table covers them all) is one
  cache entry keyed as Kernel Tuner keys them (the values joined by commas), with ``time`` in
  milliseconds (Kernel Tuner's unit) taken from the recorded median;
- a recorded failure carries Kernel Tuner's error marker instead of a time
  (``CompilationFailedConfig``, ``RuntimeFailedConfig``, or ``ErrorConfig`` for a wrong result,
  for which Kernel Tuner has no marker of its own), so it costs an evaluation there as here;
- points our constraints reject are absent from the cache, and :func:`restriction` keeps Kernel
  Tuner from proposing them (the valid set, as ``kernel_tuner.tune_cache`` infers it, except that
  failed points stay in: they are valid points that failed when run).

Cache format as ``kernel_tuner.util.process_cache`` / ``read_cache`` (1.5.0) read it:
``{"schema_version", "device_name", "kernel_name", "problem_size", "tune_params_keys",
"tune_params", "objective", "cache": {"v1,v2,...": {param: value, ..., "time": ms, ...}}}``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r3tui.domain import Dim3, MeasurementStatus
from r3tui.search.simulation import RecordedResult, SpaceFile
from r3tui.search.space import SearchSpace, config_key

SCHEMA_VERSION = "1.0.0"
# Kernel Tuner's error markers (kernel_tuner.util.ErrorConfig subclasses, stored by class name).
KT_ERROR = {
    MeasurementStatus.COMPILE_ERROR: "CompilationFailedConfig",
    MeasurementStatus.LAUNCH_ERROR: "RuntimeFailedConfig",
    MeasurementStatus.TIMEOUT: "RuntimeFailedConfig",
    MeasurementStatus.CRASHED: "RuntimeFailedConfig",
    MeasurementStatus.WRONG_RESULT: "ErrorConfig",
}
# Our block axes under the names Kernel Tuner gives thread-block dimensions.
_BLOCK_NAMES = {"block_x": "block_size_x", "block_y": "block_size_y", "block_z": "block_size_z"}
# Names Kernel Tuner refuses as tunable parameters (kernel_tuner.util.check_tune_params_list).
_FORBIDDEN = {"grid_size_x", "grid_size_y", "grid_size_z", "time"}

KTValue = int | float | str | bool


@dataclass(frozen=True)
class KTSpace:
    """One recorded space as Kernel Tuner sees it."""

    kernel_name: str
    device_name: str
    problem_size: tuple[int, ...]
    tune_params: dict[str, list[KTValue]]  # Kernel Tuner name -> values, our order
    dim_names: dict[str, str]  # Kernel Tuner name -> our dimension name
    points: dict[tuple[KTValue, ...], str]  # a valid point's values -> our config key
    document: dict[str, Any]  # the cache file's content

    @property
    def keys(self) -> list[str]:
        return list(self.tune_params)

    def config_key_of(self, params: Mapping[str, Any]) -> str:
        """Our config key of a Kernel Tuner result (KeyError: not one of our points)."""
        return self.points[tuple(params[name] for name in self.tune_params)]


def kt_param_name(dim_name: str, role: str) -> str:
    """A Kernel Tuner parameter name for one of our dimensions (``opt.maxrregcount`` ->
    ``maxrregcount``, ``block.x`` -> ``block_size_x``, ``tune.TILE`` -> ``TILE``)."""
    if role in _BLOCK_NAMES:
        return _BLOCK_NAMES[role]
    name = dim_name.split(".", 1)[-1].replace(".", "_").replace("-", "_")
    return f"p_{name}" if name in _FORBIDDEN else name


def kt_value(choice: Any) -> KTValue:
    """A dimension value as a JSON scalar that survives Kernel Tuner's ``str()`` keys."""
    if isinstance(choice, Dim3):
        return "x".join(str(v) for v in choice.as_tuple())
    if choice is None:
        return "none"
    if isinstance(choice, bool | int | str):
        return choice
    if isinstance(choice, float) and math.isfinite(choice):
        return choice
    if isinstance(choice, tuple | list):
        return "x".join(str(v) for v in choice)
    return str(choice)


def _dimension_values(space: SearchSpace) -> list[tuple[str, str, list[KTValue]]]:
    out: list[tuple[str, str, list[KTValue]]] = []
    for dim in space.dims:
        values: list[KTValue] = (
            [kt_value(c) for c in dim.choices] if dim.ordinal else list(dim.labels)
        )
        if len({str(v) for v in values}) != len(values):
            raise ValueError(f"dimension {dim.name}: values {values} collide as Kernel Tuner keys")
        out.append((kt_param_name(dim.name, dim.role), dim.name, values))
    names = [name for name, _, _ in out]
    if len(set(names)) != len(names):
        raise ValueError(f"dimension names collide as Kernel Tuner parameters: {names}")
    return out


def _entry(params: dict[str, KTValue], result: RecordedResult, timestamp: str) -> dict[str, Any]:
    entry: dict[str, Any] = dict(params)
    if result.status is MeasurementStatus.OK and result.median_s is not None:
        entry["time"] = result.median_s * 1e3
        entry["times"] = [result.median_s * 1e3]
    else:
        marker = KT_ERROR.get(result.status, "ErrorConfig")
        entry["time"] = marker
        entry["__error__"] = marker
    # Zero timings: the recorded cost of compiling and benchmarking is not simulated here (a
    # budget in evaluations, not seconds); Kernel Tuner sums these fields when present.
    entry.update(
        compile_time=0.0,
        verification_time=0.0,
        benchmark_time=0.0,
        strategy_time=0.0,
        framework_time=0.0,
        timestamp=timestamp,
    )
    return entry


def to_kt(recorded: SpaceFile) -> KTSpace:
    """The Kernel Tuner view and cache document of one recorded space."""
    space = recorded.space
    dims = _dimension_values(space)
    tune_params = {name: values for name, _, values in dims}
    points: dict[tuple[KTValue, ...], str] = {}
    cache: dict[str, dict[str, Any]] = {}
    for config in space.enumerate():
        key = config_key(config)
        result = recorded.table.get(key)
        if result is None:
            raise ValueError(f"{recorded.example}: config {key} is not in the recorded table")
        point = space.from_config(config)
        if point is None:
            raise ValueError(f"{recorded.example}: enumerated config {key} is not a valid point")
        values = tuple(
            values[p] if dim.ordinal else p
            for dim, (_, _, values), p in zip(space.dims, dims, point, strict=True)
        )
        points[values] = key
        params = dict(zip(tune_params, values, strict=True))
        cache[",".join(str(v) for v in values)] = _entry(params, result, recorded.recorded_at)
    work = space.launch.work
    problem_size = work.as_tuple() if work is not None else (1,)
    document = {
        "schema_version": SCHEMA_VERSION,
        "device_name": recorded.gpu,
        "kernel_name": recorded.example,
        "problem_size": list(problem_size),
        "tune_params_keys": list(tune_params),
        "tune_params": tune_params,
        "objective": "time",
        "cache": cache,
    }
    return KTSpace(
        recorded.example,
        recorded.gpu,
        problem_size,
        tune_params,
        {name: ours for name, ours, _ in dims},
        points,
        document,
    )


def write_cache(kt: KTSpace, path: Path) -> Path:
    """Write the cache file (Kernel Tuner wants the ``.json`` suffix)."""
    if path.suffix != ".json":
        raise ValueError(f"Kernel Tuner cache files end in .json, got {path}")
    path.write_text(json.dumps(kt.document, indent=1))
    return path


def restriction(kt: KTSpace) -> Any:
    """A python-constraint ``FunctionConstraint`` that admits exactly our valid points, for
    ``tune_kernel(restrictions=[...])`` (kernel_tuner must be installed)."""
    from constraint import FunctionConstraint  # type: ignore[import-untyped,import-not-found,unused-ignore]

    valid = frozenset(kt.points)

    def is_valid_point(*values: KTValue) -> bool:
        return values in valid

    return FunctionConstraint(is_valid_point)


def best_time_s(
    kt: KTSpace, table: Mapping[str, RecordedResult], results: Sequence[Mapping[str, Any]]
) -> float:
    """The best time among Kernel Tuner's results, read from OUR table (not from Kernel
    Tuner's copy of it), so both searches are scored on the same recorded numbers."""
    best = math.inf
    for result in results:
        if "__error__" in result:
            continue
        recorded = table[kt.config_key_of(result)]
        if recorded.status is MeasurementStatus.OK and recorded.median_s is not None:
            best = min(best, recorded.median_s)
    return best


def unique_evaluations(kt: KTSpace, results: Sequence[Mapping[str, Any]]) -> int:
    """How many distinct configurations Kernel Tuner's results hold (what ``max_fevals``
    counts in simulation mode: a configuration served again from the cache is not counted)."""
    return len({kt.config_key_of(r) for r in results})
