"""The outer loop on CPU: rule mutations, real NVRTC compiles, real skopt, a real SQLite file.

The GPU replay is replaced by ``CompiledCostEvaluator`` (a named fake: real compiles, modelled
times); the real path runs in tests/gpu/test_gpu_campaign.py on the device.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from db import repository as repo
from db.session import Database, open_database
from r3tui.domain import (
    Campaign,
    Dim3,
    KernelLaunch,
    Recording,
    TrialConfig,
    VariantOrigin,
    VariantStatus,
)
from r3tui.engine import InnerSettings, KernelSource
from r3tui.engine.campaign import CampaignRun, CampaignSettings, StepReport
from r3tui.engine.control import CampaignControl
from r3tui.engine.replay_llm import replay_tree
from r3tui.engine.report import build_report, export_variant, render
from r3tui.engine.tune import make_mutator_from
from r3tui.record.manifest import LaunchInfo
from r3tui.search import DeviceLimits
from tests.unit.campaign_fakes import CompiledCostEvaluator, FactorCostEvaluator

if TYPE_CHECKING:
    from collections.abc import Iterator

    from r3tui.search import SearchSpace

REPO = Path(__file__).resolve().parents[2]
SOURCE = KernelSource((REPO / "examples/stencil7/kernel.cu").read_text(), "stencil7")
LAUNCH = LaunchInfo(
    grid=Dim3(8, 8, 8), block=Dim3(8, 8, 8), work=Dim3(64, 64, 64), block_tunable=True
)
SETTINGS = CampaignSettings(
    variants=5,
    inner_trials=4,
    seed_trials=6,
    give_up_after=2,
    llm_share=0.0,
    migration_interval=3,
    inner=InnerSettings(batch=3, finalists=2, rounds=3),
)


def new_campaign(database: Database, settings: CampaignSettings = SETTINGS) -> int:
    with database.session_scope() as s:
        launch = KernelLaunch("stencil7", LAUNCH.grid, LAUNCH.block)
        rid = repo.add_recording(s, Recording("b", "ab" * 32, "stencil7", launch), {})
        return repo.create_campaign(
            s,
            Campaign(
                "remix", rid, seed=settings.seed, settings={"mode": "remix", **settings.to_json()}
            ),
        )


def make_run(
    database: Database,
    cid: int,
    settings: CampaignSettings = SETTINGS,
    control: CampaignControl | None = None,
    progress=None,
    backend=None,
) -> CampaignRun:
    return CampaignRun(
        database,
        cid,
        settings,
        SOURCE,
        LAUNCH,
        DeviceLimits(),
        make_mutator_from(settings, backend),
        CompiledCostEvaluator,
        control=control,
        progress=progress,
    )


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, CampaignRun]:
    db = tmp_path_factory.mktemp("campaign") / "c.sqlite"
    database = open_database(db)
    cid = new_campaign(database)
    run = make_run(database, cid)
    assert run.run() == SETTINGS.variants
    return db, cid, run


def test_a_campaign_stores_a_tree_of_rule_variants_with_their_funnel_outcome(
    finished: tuple[Path, int, CampaignRun],
) -> None:
    db, cid, _ = finished
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
        trials = repo.finished_trials(s, cid)
        events = repo.events(s, cid)
        elites = repo.elites(s, cid)
    seed, *children = variants
    assert seed.origin is VariantOrigin.SEED and seed.status is VariantStatus.VERIFIED
    # a rule that does not apply, or a source the campaign has, is counted and not stored
    skipped = [e for e in events if e.kind == "skipped"]
    n_skipped = sum(sum(e.data["counts"].values()) for e in skipped if e.data)
    assert len(children) + n_skipped == SETTINGS.variants
    assert sorted(int(c.features["index"]) for c in children) == sorted(
        set(int(c.features["index"]) for c in children))
    assert all(0 <= int(c.features["index"]) < SETTINGS.variants for c in children)
    ids = {v.id for v in variants}
    for child in children:
        assert child.origin is VariantOrigin.RULE and child.parent_id in ids
        assert child.status is not VariantStatus.PENDING
        assert child.operator and "family" in child.features
        if child.status is not VariantStatus.APPLY_FAILED:
            assert child.diff and child.source != seed.source
    per_variant = {v.id: sum(1 for t in trials if t.variant_id == v.id) for v in variants}
    assert per_variant[seed.id] == SETTINGS.seed_trials
    # a child's trials: its budget, and what a climb from its best added (lineage.Climb)
    climbed = {e.data["variant_id"]: e.data["climbed"] for e in events
               if e.kind == "inner_done" and e.data}
    assert all(per_variant[c.id] <= SETTINGS.inner_trials + climbed.get(c.id, 0)
               for c in children)
    assert sum(1 for e in events if e.kind == "variant") == 1 + len(children)
    verified = {
        v.id for v in variants if v.status in (VariantStatus.VERIFIED, VariantStatus.IMPROVED)
    }
    assert elites and {e.variant_id for e in elites} <= verified
    assert {e.island for e in elites} == set(range(SETTINGS.islands))


def test_a_child_is_warm_started_from_its_parents_best_configurations(
    finished: tuple[Path, int, CampaignRun],
) -> None:
    db, cid, _ = finished
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
        evaluated = [v for v in variants[1:] if v.status is not VariantStatus.APPLY_FAILED]
        assert evaluated
        child = evaluated[0]
        parent_trials = repo.trials_of_variant(s, child.parent_id)
        child_trials = repo.trials_of_variant(s, child.id)
    best_parent = min(
        (t for t in parent_trials if t.measurement.time), key=lambda t: t.measurement.time.median_s
    )
    # first the tunables the child's change added, at their smallest other values (or those
    # its `// r3: first` lines name), on the parent's best configuration; then that
    # configuration itself
    from r3tui.engine import build_space
    from r3tui.engine.lineage import exercising
    from r3tui.search import parse_first, parse_tunables

    space = build_space(LAUNCH, replace(SOURCE, text=child.source), SETTINGS.inner,
                        DeviceLimits())
    parent = next(v for v in variants if v.id == child.parent_id)
    inherited = {t.name for t in parse_tunables(parent.source)}
    first = [*exercising(space, [best_parent.config], SETTINGS.exercise, inherited,
                         parse_first(child.source)),
             best_parent.config]
    assert [t.config for t in child_trials[: len(first)]] == first


def _sgemm_child(rule: str) -> tuple[LaunchInfo, SearchSpace, str]:
    """sgemm (recorded at 16x16 over 1024x1024) changed by ``rule``: the child's launch, its
    space and its source."""
    import random

    from r3tui.engine import build_space
    from r3tui.remix.rules import apply_rule

    text = (REPO / "examples/sgemm/kernel.cu").read_text()
    made = apply_rule(rule, text, "sgemm", random.Random(0))
    assert made.ok and made.source is not None, made.reason
    launch = LaunchInfo(grid=Dim3(64, 64), block=Dim3(16, 16), work=Dim3(1024, 1024),
                        block_tunable=True)
    return launch, build_space(launch, KernelSource(made.source, "sgemm"), InnerSettings(),
                               DeviceLimits()), made.source


def test_a_childs_new_tunables_are_tried_first_at_their_smallest_other_values() -> None:
    """sgemm coarsened (R3_CF_X, R3_CF_Y in 1 2 4 8, default 1) from a parent configuration
    that sets none of them: 2x2 then 4x4 elements a thread, the parent's options and block kept;
    a tunable the parent already sets keeps its value."""
    from r3tui.domain import TrialConfig
    from r3tui.engine.lineage import exercising
    from r3tui.search import parse_first

    launch, space, source = _sgemm_child("coarsen")
    added = sorted(t.name for t in space.tunables if t.name.startswith("R3_CF"))
    assert added, space.tunables
    parent = TrialConfig(options=("--use_fast_math",), block=Dim3(16, 16))
    configs = exercising(space, [parent], 2)
    assert [{n: c.tunables[n] for n in added} for c in configs] == [
        dict.fromkeys(added, 2), dict.fromkeys(added, 4)]
    assert all(c.options == parent.options and (c.block or launch.block) == parent.block
               for c in configs)
    assert exercising(space, [parent], 2, first=parse_first(source)) == configs  # no first line
    assert exercising(space, [parent], 0) == [] and exercising(space, [], 2) == []
    # the parent already set them, or its source declares them (a configuration leaves a
    # tunable at its default out): nothing new to exercise
    assert exercising(space, [configs[1]], 2) == []
    assert exercising(space, [parent], 2, set(added)) == []
    old = CampaignSettings.from_json({k: v for k, v in SETTINGS.to_json().items()
                                      if k != "exercise"})
    assert old.exercise == 0 and CampaignSettings().exercise == 2


def test_a_childs_first_steps_skip_what_its_space_refuses_and_the_parents_limits() -> None:
    """sgemm coarsened along x and z: its one layer makes `// r3: exact z` allow R3_CF_Z 1
    alone.  The child's first configurations coarsen along x (2, then 4 columns a thread);
    until session 39 each step set R3_CF_Z too, was no point of the space and was dropped:
    8 of that session's 17 coarsened sgemm children started with no step (variant 133 of
    its campaigns: two configurations of the parent, then the search's asks)."""
    import random

    from r3tui.domain import TrialConfig
    from r3tui.engine import build_space
    from r3tui.engine.lineage import exercising, uncapped
    from r3tui.remix.rules import apply_rule

    text = (REPO / "examples/sgemm/kernel.cu").read_text()
    # the rule no longer coarsens sgemm's one-layer z (single_element_axes): the x and z
    # rewrite made directly, as the rule made it before
    from r3tui.analysis.body import kernel_body
    from r3tui.analysis.per_thread import grid_indices, unchecked_axes
    from r3tui.remix.coarsen import _Coarsening

    found = kernel_body(text, "sgemm")
    assert found is not None
    body, parsed = found
    xz = tuple(ix for ix in grid_indices(body, parsed) if ix.axis in "xz")
    source, _ = _Coarsening(text, body, parsed, xz,
                            frozenset(unchecked_axes(text, "sgemm"))).rewrite()
    assert all(not (s and "R3_CF_Z" in s) for s in (
        apply_rule("coarsen", text, "sgemm", random.Random(seed)).source for seed in range(20)))
    assert "// r3: exact z" in source
    launch = LaunchInfo(grid=Dim3(81, 81), block=Dim3(16, 16), work=Dim3(1290, 1290),
                        block_tunable=True)
    space = build_space(launch, KernelSource(source, "sgemm"), InnerSettings(), DeviceLimits())
    parent = TrialConfig(options=("--use_fast_math",), block=Dim3(128, 2))
    assert space.completed(replace(parent, tunables={"R3_CF_X": 2, "R3_CF_Z": 2})) is None
    configs = exercising(space, [parent], 2)
    assert [(c.tunables, c.block) for c in configs] == [
        ({"R3_CF_X": 2}, Dim3(128, 2)), ({"R3_CF_X": 2}, None),
        ({"R3_CF_X": 4}, Dim3(128, 2)), ({"R3_CF_X": 4}, None)]
    # a parent that limits registers: each step also runs without its limits (the parent's
    # --maxrregcount=32 spilled sgemm's 4x4 outputs, 3.0 ms against 709 µs for 2x2)
    capped = TrialConfig(options=("--use_fast_math", "--maxrregcount=32"),
                         block=Dim3(16, 16), launch_bounds=(256, 4))
    assert space.completed(capped) is not None
    steps = exercising(space, [capped], 1)
    assert [(c.tunables, c.options, c.launch_bounds) for c in steps] == [
        ({"R3_CF_X": 2}, capped.options, (256, 4)),
        ({"R3_CF_X": 2}, ("--use_fast_math",), None)]
    assert uncapped(replace(parent, launch_bounds=(128, 2))) == parent  # nothing else changes
    # tunables that fit alone but not together: each alone, in the order the space has them
    both = source.replace("    // r3: tune R3_CF_Z", "    // r3: require R3_CF_X * R3_CF_Y < 4\n"
                          "    // r3: tune R3_CF_Z", 1)
    both = both.replace("R3_CF_Z", "R3_CF_Y").replace("// r3: exact z\n", "")
    assert both.count("R3_CF_Y < 4") == 1
    pair = build_space(launch, KernelSource(both, "sgemm"), InnerSettings(), DeviceLimits())
    assert [c.tunables for c in exercising(pair, [replace(parent, block=None)], 1)] == [
        {"R3_CF_X": 2}, {"R3_CF_Y": 2}]


def test_a_childs_new_tile_is_tried_with_the_shared_memory_it_needs() -> None:
    """sgemm tiled through shared memory (R3_TILE, default 0: no tile), from a parent whose
    configuration launches with no dynamic shared memory: the first configurations launch
    with the bytes the tile's expression gives for the parent's block.  Until session 36 they
    kept the parent's size (none), were not points of the child's space and were dropped, so
    an H100 campaign's tile child never tried a small tile (c2.sqlite, variant 31).  A
    parent's block other than the recorded one: each step is also tried on the recorded
    block.  The tiles tried are the rule's `// r3: first` ones, 64 then 32: at the smallest
    (4, 8) every tile child of session 38's sgemm campaigns lost to its parent."""
    from r3tui.domain import TrialConfig
    from r3tui.engine.lineage import exercising
    from r3tui.search import parse_first
    from r3tui.search.strategy import RandomSearch

    _launch, space, source = _sgemm_child("tile_shared")
    assert [t.name for t in space.tunables] == ["R3_TILE"]
    assert parse_first(source) == {"R3_TILE": (64, 32)}
    parent = TrialConfig(options=("--use_fast_math",), block=Dim3(128, 2))
    configs = exercising(space, [parent], 2, first=parse_first(source))
    # A: blockDim.y rows of R3_TILE floats; B: R3_TILE rows of blockDim.x floats; each tile
    # on the parent's block, then on the recorded 16x16 with the parent's options
    assert [(c.tunables, c.block, c.shared_mem_bytes) for c in configs] == [
        ({"R3_TILE": 64}, Dim3(128, 2), (2 + 128) * 64 * 4),
        ({"R3_TILE": 64}, None, 32 * 64 * 4),
        ({"R3_TILE": 32}, Dim3(128, 2), (2 + 128) * 32 * 4),
        ({"R3_TILE": 32}, None, 32 * 32 * 4)]
    # without the line, the smallest tiles other than none
    assert [c.tunables for c in exercising(space, [parent], 2)][::2] == [
        {"R3_TILE": 4}, {"R3_TILE": 8}]
    assert all(space.from_config(c) is not None and c.options == parent.options
               for c in configs)
    # launch bounds of the parent's 128 threads do not fit 16x16: dropped on the recorded block
    small = TrialConfig(block=Dim3(64, 2), launch_bounds=(128, 2))
    assert space.from_config(small) is not None
    assert [(c.block, c.launch_bounds) for c in exercising(space, [small], 1)] == [
        (Dim3(64, 2), (128, 2)), (None, None)]
    # a search warm-started with a parent's configuration that names a tile but not its
    # bytes asks it as the space launches it
    search = RandomSearch(space, 0)
    assert search.warm_start([replace(configs[0], shared_mem_bytes=None)]) == 1
    assert search.ask()[0].shared_mem_bytes == (2 + 128) * 64 * 4


def _coarse_tiled_sgemm() -> tuple[SearchSpace, str]:
    """sgemm (recorded at 16x16 over 1024x1024) coarsened along x and y, then tiled: its space
    and its source."""
    import random

    from r3tui.engine import build_space
    from r3tui.remix.rules import apply_rule

    text = (REPO / "examples/sgemm/kernel.cu").read_text()
    # the rule draws its axes: the first draw that coarsens both x and y
    coarse = next(c for c in (apply_rule("coarsen", text, "sgemm", random.Random(seed))
                              for seed in range(20))
                  if c.source and "R3_CF_X" in c.source and "R3_CF_Y" in c.source)
    assert coarse.ok and coarse.source is not None
    tiled = apply_rule("tile_shared", coarse.source, "sgemm", random.Random(0))
    assert tiled.ok and tiled.source is not None
    launch = LaunchInfo(grid=Dim3(64, 64), block=Dim3(16, 16), work=Dim3(1024, 1024),
                        block_tunable=True)
    return build_space(launch, KernelSource(tiled.source, "sgemm"), InnerSettings(),
                       DeviceLimits()), tiled.source


def test_a_tile_of_a_coarsened_child_first_keeps_the_interleaved_layout() -> None:
    """sgemm coarsened along x and y, then tiled: the tile rule's `// r3: first
    R3_X_CONTIGUOUS 0` keeps the layout as the parent has it in the child's first steps
    (contiguous x lost at every point of session 40's rule_gains), which set the tile (64,
    then 32) and the two stages; the same child without the line tries contiguous x."""
    from r3tui.domain import TrialConfig
    from r3tui.engine.lineage import exercising
    from r3tui.search import parse_first

    space, source = _coarse_tiled_sgemm()
    parent = TrialConfig(tunables={"R3_CF_X": 2, "R3_CF_Y": 2})
    inherited = {"R3_CF_X", "R3_CF_Y"}
    first = parse_first(source)
    assert first["R3_X_CONTIGUOUS"] == (0,)
    steps = exercising(space, [parent], 2, inherited, first)
    assert [{k: v for k, v in c.tunables.items() if k not in inherited} for c in steps] == [
        {"R3_TILE": 32, "R3_STAGES": 2}, {"R3_TILE": 64, "R3_STAGES": 2}]
    without = exercising(space, [parent], 2, inherited,
                         {k: v for k, v in first.items() if k != "R3_X_CONTIGUOUS"})
    assert all(c.tunables.get("R3_X_CONTIGUOUS") == 1 for c in without)


def test_a_tile_along_both_axes_of_a_coarsened_child_first_sets_the_register_block() -> None:
    """sgemm coarsened along x and y, then tiled along both: the tile rule names the factors
    the tiles paid with (4x4 outputs, then 4 rows by 2 columns) although the parent declared
    them, so the child's first steps leave the parent's one-axis factors (session 43's
    campaigns: R3_CF_Y 2, tuned without a tile) for the register block; the parent's best
    follows them in the warm start.  A grandchild whose source keeps the line is given only its
    own change's lines (the campaign leaves out its parent's), so it keeps its parent's."""
    from r3tui.domain import TrialConfig
    from r3tui.engine.lineage import exercising, first_lines
    from r3tui.search import parse_first

    space, source = _coarse_tiled_sgemm()
    first = parse_first(source)
    assert first["R3_CF_X"] == (4, 2) and first["R3_CF_Y"] == (4,)
    assert first["R3_TILE"] == (32, 64)
    parent = TrialConfig(tunables={"R3_CF_Y": 2})
    inherited = {"R3_CF_X", "R3_CF_Y"}
    steps = exercising(space, [parent], 2, inherited, first)
    assert [(c.tunables["R3_CF_X"], c.tunables["R3_CF_Y"], c.tunables["R3_TILE"])
            for c in steps] == [(4, 4, 32), (2, 4, 64)]
    assert all(space.from_config(c) is not None for c in steps)
    # the campaign's filter: the lines a parent already had are not its child's
    own = {n: v for n, v in first.items() if first_lines(source).get(n) != v}
    assert own == {}
    grandchild = exercising(space, [replace(steps[0], tunables={
        **steps[0].tunables, "R3_CF_X": 2})], 2, set(first) | inherited, own)
    assert grandchild == []
    assert first_lines("// r3: first R3_NOPE 4\n") == {}  # a parent whose lines do not parse


@pytest.mark.parametrize(("bodies", "sm_count", "fill"), [
    (7327, 132, 32),  # the campaigns' nbody (scale 0.05) on an H100: no split fills 270,336 threads
    (32768, 132, 16),  # rule_gains' nbody: 16 threads a body is the first past it
    (1 << 20, 132, None),  # the grid fills the device already: smallest first
    (7327, 0, None),  # the device's multiprocessors not known
])
def test_a_split_that_fills_the_device_is_tried_first(bodies: int, sm_count: int,
                                                      fill: int | None) -> None:
    """nbody's loop split over R3_SPLIT threads a body (`// r3: threads_per_item`): where the
    parent launches fewer threads than the device holds, the child first tries the smallest
    split that fills it, then the smallest split as before."""
    import random

    from r3tui.domain import TrialConfig
    from r3tui.engine import build_space
    from r3tui.engine.lineage import exercising, filling
    from r3tui.remix.rules import apply_rule

    made = apply_rule("split_loop", (REPO / "examples/nbody/kernel.cu").read_text(), "nbody",
                      random.Random(0))
    assert made.ok and made.source is not None, made.reason
    launch = LaunchInfo(grid=Dim3(-(-bodies // 256)), block=Dim3(256), work=Dim3(bodies),
                        block_tunable=True)
    space = build_space(launch, KernelSource(made.source, "nbody"), InnerSettings(),
                        DeviceLimits(sm_count=sm_count))
    parent = TrialConfig(options=("--use_fast_math",), block=Dim3(256))
    first = filling(space, made.source, parent)
    assert first == ({} if fill is None else {"R3_SPLIT": (fill,)})
    splits = [c.tunables["R3_SPLIT"] for c in exercising(space, [parent], 2, first=first)]
    assert splits == ([2, 4] if fill is None else [fill, 2])
    # a parent that splits already: nothing new to exercise, nothing to fill
    assert filling(space, made.source, replace(parent, tunables={"R3_SPLIT": 2})) == {}


def test_the_bandit_starts_the_compiler_hints_with_misses(
        finished: tuple[Path, int, CampaignRun]) -> None:
    """With no record of their own, restrict_const and the other hints come first less often
    than the structural transformations; a campaign stored before the prior keeps none."""
    _, _, run = finished
    hints = {"restrict_const", "read_only_loads", "unroll_inner_loop", "expose_tunable"}
    kept = run.settings
    counts = {}
    try:
        for prior in (2, 0):
            run.settings = replace(kept, hint_prior=prior, adaptive=True)
            orders = [run._preference(1000 + k, run.seed_source.text) for k in range(300)]
            counts[prior] = sum(1 for o in orders if o and o[0] in hints)
    finally:
        run.settings = kept
    assert counts[2] < counts[0], counts
    old = CampaignSettings.from_json({k: v for k, v in SETTINGS.to_json().items()
                                      if k != "hint_prior"})
    assert old.hint_prior == 0 and CampaignSettings().hint_prior == 2


def test_a_childs_model_is_told_its_ancestors_trials(
    finished: tuple[Path, int, CampaignRun],
) -> None:
    db, cid, _ = finished
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        variants = {v.id: v for v in repo.campaign_variants(s, cid)}
        counts = {v: len(repo.trials_of_variant(s, v)) for v in variants}
        done = [e.data for e in repo.events(s, cid) if e.kind == "inner_done" and e.data]
    assert len(done) >= 2
    for data in done:
        variant = variants[data["variant_id"]]
        expected, parent_id, generations = 0, variant.parent_id, 0
        while parent_id is not None and generations < SETTINGS.transfer:
            expected += counts[parent_id]
            parent_id, generations = variants[parent_id].parent_id, generations + 1
        assert data["prior_points"] == expected
    assert any(d["prior_points"] > 0 for d in done)
    old = CampaignSettings.from_json({k: v for k, v in SETTINGS.to_json().items()
                                      if k != "transfer"})
    assert old.transfer == 0  # a campaign stored before transfer resumes without it


def test_resume_rebuilds_the_same_archive(finished: tuple[Path, int, CampaignRun]) -> None:
    db, cid, run = finished
    with open_database(db) as database:
        again = make_run(database, cid)
        assert again.state.archive.elites() == run.state.archive.elites()
        assert again.state.n_evaluated == run.state.n_evaluated


def test_a_stopped_campaign_resumes_to_its_budget_without_repeating_work(tmp_path: Path) -> None:
    database = open_database(tmp_path / "stop.sqlite")
    cid = new_campaign(database)
    control = CampaignControl()
    seen: list[StepReport] = []

    def stop_after_two(step: StepReport) -> None:
        seen.append(step)
        if len([x for x in seen if x.origin is not VariantOrigin.SEED]) == 2:
            control.request_stop()

    made = make_run(database, cid, control=control, progress=stop_after_two).run()
    assert 2 <= made < SETTINGS.variants
    with database.session_scope() as s:
        trials_before = len(repo.finished_trials(s, cid))
    resumed = make_run(database, cid).run()
    assert resumed == SETTINGS.variants
    with database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
        trials = repo.finished_trials(s, cid)
        events = repo.events(s, cid)
    indices = [v.features["index"] for v in variants if v.origin is not VariantOrigin.SEED]
    # no proposal index made twice; the ones missing were counted (declined or duplicate)
    assert len(set(indices)) == len(indices) and set(indices) <= set(range(SETTINGS.variants))
    n_skipped = sum(sum(e.data["counts"].values()) for e in events
                    if e.kind == "skipped" and e.data)
    assert len(indices) + n_skipped >= SETTINGS.variants
    assert all(v.status is not VariantStatus.PENDING for v in variants)
    assert len(trials) > trials_before
    database.close()


def test_generational_mode_writes_pending_variants_that_evaluate_later(tmp_path: Path) -> None:
    database = open_database(tmp_path / "gen.sqlite")
    cid = new_campaign(database)
    generator = CampaignRun(
        database,
        cid,
        SETTINGS,
        SOURCE,
        LAUNCH,
        DeviceLimits(),
        make_mutator_from(SETTINGS, None),
        None,
    )
    written = generator.generate(3)
    assert written[0].origin is VariantOrigin.SEED
    with database.session_scope() as s:
        assert repo.finished_trials(s, cid) == []
        pending = [v for v in repo.campaign_variants(s, cid) if v.status is VariantStatus.PENDING]
    assert len(pending) >= 2  # the seed and the rule variants that applied
    evaluated = make_run(database, cid).evaluate_pending()
    assert evaluated == len(pending)
    assert make_run(database, cid).pending() == []
    database.close()


def test_a_re_run_from_the_record_rebuilds_the_same_tree(
    finished: tuple[Path, int, CampaignRun],
) -> None:
    db, cid, _ = finished
    with open_database(db) as database:
        new = new_campaign(database)
        with database.session_scope() as s:
            stored = sum(1 for v in repo.campaign_variants(s, cid)
                         if v.origin is not VariantOrigin.SEED)
        run = make_run(database, new)
        assert replay_tree(run, cid) == stored
        with database.session_scope() as s:
            old = repo.campaign_variants(s, cid)
            redo = repo.campaign_variants(s, new)
    index = {v.id: i for i, v in enumerate(old)}
    index_new = {v.id: i for i, v in enumerate(redo)}

    def shape(variants, idx):
        return [
            (
                v.source,
                v.origin,
                v.operator,
                v.status is VariantStatus.APPLY_FAILED,
                idx.get(v.parent_id),
            )
            for v in variants
        ]

    assert shape(redo, index_new) == shape(old, index)


def test_a_re_run_without_a_gpu_re_makes_the_tree_pending_and_evaluates_it_later(
    finished: tuple[Path, int, CampaignRun],
) -> None:
    db, cid, _ = finished
    with open_database(db) as database:
        new = new_campaign(database)
        run = make_run(database, new)
        run.evaluator_for = None  # what --replay-llm --generate-only builds: no GPU, no evaluator
        made = replay_tree(run, cid, evaluate=False)
        with database.session_scope() as s:
            old = [v for v in repo.campaign_variants(s, cid) if v.origin is not VariantOrigin.SEED]
            redo = [v for v in repo.campaign_variants(s, new)
                    if v.origin is not VariantOrigin.SEED]
        assert made == len(old) == len(redo)
        assert [v.source for v in redo] == [v.source for v in old]
        failed = VariantStatus.APPLY_FAILED
        assert {v.status for v in redo} <= {VariantStatus.PENDING, failed}
        assert [v.status is failed for v in redo] == [v.status is failed for v in old]
        pending = sum(v.status is VariantStatus.PENDING for v in redo)
        assert pending > 0
        # later, on a GPU: r3 evaluate measures them (seed first)
        assert make_run(database, new).evaluate_pending() == pending + 1
        with database.session_scope() as s:
            assert not [v for v in repo.campaign_variants(s, new)
                        if v.status is VariantStatus.PENDING]


def test_report_and_export_describe_the_best_variant(
    finished: tuple[Path, int, CampaignRun], tmp_path: Path
) -> None:
    db, cid, _ = finished
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        report = build_report(s, cid)
        files = export_variant(s, cid, None, tmp_path / "export")
    assert report.original_s and report.best_s and report.best_s <= report.original_s
    assert report.speedup == pytest.approx(report.original_s / report.best_s)
    # the final re-timing measured the steps from the original to the winner (FAKE times)
    assert report.final is not None and report.contribution_ci
    levels = report.final["levels"]
    assert [lv["level"] for lv in levels] == list(report.contributions)
    assert set(report.contributions) <= {"source", "options", "launch", "source+options",
                                         "options+launch", "source+options+launch"}
    assert levels[-1]["config"] == report.final["config"]
    assert report.best_config == TrialConfig.from_json(report.final["config"])
    # the steps not shipped come after the one that ships, and each ends slower than it
    after = 1.0
    for lv in report.final.get("dropped", []):
        after *= lv["speedup"]
        assert after < 1.0 and lv["level"] not in report.contributions
    shown = replace(report, final={**report.final, "dropped": [
        {"level": "launch", "speedup": 0.958, "ci": [0.955, 0.961], "config": {}}]})
    assert ("  not shipped: its launch step, 0.958x [0.955, 0.961] over the step before it "
            "when re-timed") in render(shown)
    product = 1.0
    for level, x in report.contributions.items():
        low, high = report.contribution_ci[level]
        assert low <= x <= high
        product *= x
    assert product == pytest.approx(report.final["speedup"], rel=0.02)
    assert "rule" in report.yields
    assert report.yields["rule"].proposals + sum(report.skipped.values()) == SETTINGS.variants
    if report.skipped:
        assert any(line.startswith("not stored: ") for line in render(report))
    text = "\n".join(render(report))
    assert "speedup" in text and "yield rule" in text
    assert "contributions: " in text and "re-timed interleaved with the original" in text
    names = {p.name for p in files}
    assert {"stencil7.cu", "options.txt", "launch.json", "stencil7.patch"} <= names
    launch = json.loads(next(p for p in files if p.name == "launch.json").read_text())
    from r3tui.search.source import work_divisors

    source = next(p for p in files if p.name == "stencil7.cu").read_text()
    assert launch["work_per_thread"] == list(work_divisors(source, launch["tunables"]))


def test_a_wall_time_budget_leaves_the_source_search_most_of_it(tmp_path: Path) -> None:
    """On the corpus a full campaign of `--budget 8s` spent its 8 s on the original's 40
    trials and proposed no source at all; the original may now take SEED_SHARE of it."""

    from r3tui.engine.campaign import SEED_SHARE

    settings = replace(SETTINGS, variants=None, seconds=4.0, seed_trials=400)
    database = open_database(tmp_path / "wall.sqlite")
    cid = new_campaign(database, settings)
    make_run(database, cid, settings).run()
    with database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
        trials = repo.finished_trials(s, cid)
    seed = next(v for v in variants if v.origin is VariantOrigin.SEED)
    seed_trials = [t for t in trials if t.variant_id == seed.id]
    assert 0 < len(seed_trials) < settings.seed_trials  # stopped by its share of the time
    assert SEED_SHARE < 0.5
    children = [v for v in variants if v.origin is VariantOrigin.RULE]
    assert any(t.variant_id in {c.id for c in children} for t in trials), children
    database.close()


def test_a_budget_the_original_spends_alone_still_searches_one_source_variant(
        tmp_path: Path) -> None:
    """gelu on the H200: its slow replays spent all of `--budget 8s` on the original, and
    the campaign searched no source; proposals go on past the budget until one is stored
    (one counted and not stored, such as a change that compiles to the original's code, is no
    source searched), and only that one."""
    settings = replace(SETTINGS, variants=None, seconds=0.001, seed_trials=3)
    database = open_database(tmp_path / "short.sqlite")
    cid = new_campaign(database, settings)
    run = make_run(database, cid, settings)
    made = run.run()
    with database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
        trials = repo.finished_trials(s, cid)
        events = repo.events(s, cid)
    (child,) = [v for v in variants if v.origin is not VariantOrigin.SEED]
    assert any(t.variant_id == child.id for t in trials), child.status_reason
    skipped = sum(sum(e.data["counts"].values()) for e in events
                  if e.kind == "skipped" and e.data)
    assert made == 1 + skipped
    assert run.timing.wall_s() > settings.seconds
    database.close()

class ScriptedBackend:
    """A named fake of a language model: answers from a script, in order, and keeps every
    prompt it was sent (the real model runs in tests/unit/test_remix_llm.py)."""

    name = "scripted"

    def __init__(self, answers: list[str]) -> None:
        self.answers = list(answers)
        self.prompts: list[str] = []

    def complete(self, messages, *, sampling, grammar=None, grammar_name=None, check=None):  # type: ignore[no-untyped-def]
        from r3tui.domain import LLMCall
        from r3tui.remix.backends import Completion, render_prompt

        self.prompts.append("\n".join(m.content for m in messages))
        prompt = render_prompt(messages)  # as a real backend records it
        answer = self.answers.pop(0) if self.answers else "no answer"
        call = LLMCall("scripted", "00" * 32, prompt, answer, {"grammar": grammar_name},
                       sampling.seed, len(prompt) // 4, len(answer) // 4, 0.0, backend="scripted")
        return Completion(answer, call, "stop")


BROKEN = ("<<<<<<< SEARCH\n    long long sy = nx;\n=======\n    long long sy = nx_wrong;\n"
          ">>>>>>> REPLACE\n")
# a repair whose code differs from the original's (a `const` alone would compile to the same
# code, which the campaign does not store again)
FIXED = ("<<<<<<< SEARCH\n    long long sy = nx_wrong;\n=======\n    volatile long long sy = nx;\n"
         ">>>>>>> REPLACE\n")


def model_settings(variants: int, **changes: object) -> CampaignSettings:
    """A small campaign whose every proposal goes to the model, without prefetch: a scripted
    model's answers then go to the proposals in the order written."""
    settings = CampaignSettings(variants=variants, inner_trials=2, seed_trials=3,
                                give_up_after=2, llm_share=1.0, prefetch=False, repair=True,
                                inner=InnerSettings(batch=2, finalists=1, rounds=2))
    return replace(settings, **changes)  # type: ignore[arg-type]


def test_a_change_that_does_not_compile_goes_back_to_the_model_once(tmp_path: Path) -> None:
    settings = model_settings(2)
    database = open_database(tmp_path / "c.sqlite")
    cid = new_campaign(database, settings)
    model = ScriptedBackend([BROKEN, FIXED])
    run = make_run(database, cid, settings, backend=model)
    assert run.run() == 2  # the proposal and its repair
    with database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
    broken = next(v for v in variants if v.origin is VariantOrigin.LLM)
    repaired = next(v for v in variants if v.origin is VariantOrigin.REPAIR)
    assert broken.status is VariantStatus.COMPILE_FAILED
    assert repaired.parent_id == broken.id and repaired.operator == broken.operator
    assert repaired.status in (VariantStatus.VERIFIED, VariantStatus.IMPROVED)
    assert "volatile long long sy = nx;" in repaired.source
    # the repair prompt shows the failed change and the compiler's complaint about it
    first, second = model.prompts
    assert "nx_wrong" not in first and "long long sy = nx_wrong;" in second
    assert "It failed: compile_failed:" in second and "nx_wrong" in second.split("It failed:")[1]
    with database.session_scope() as s:  # `r3 report` counts repairs as a source of their own
        yields = build_report(s, cid).yields
    assert yields["repair"].proposals == 1 and yields["llm"].proposals == 1
    database.close()


def test_a_repair_that_fails_again_is_not_repaired_and_the_setting_turns_it_off(
        tmp_path: Path) -> None:
    settings = model_settings(3)
    database = open_database(tmp_path / "c.sqlite")
    cid = new_campaign(database, settings)
    again = FIXED.replace("volatile long long sy = nx;", "long long sy = nx_still_wrong;")
    other = BROKEN.replace("nx_wrong", "nx_other")  # not the first change again (a duplicate)
    model = ScriptedBackend([BROKEN, again, other, again])
    make_run(database, cid, settings, backend=model).run()
    with database.session_scope() as s:
        origins = [v.origin for v in repo.campaign_variants(s, cid)]
    # proposal, its repair (failed), then a new proposal: a repair is never repaired
    assert origins.count(VariantOrigin.REPAIR) == 1 and origins.count(VariantOrigin.LLM) == 2
    off = model_settings(3, repair=False)
    cid2 = new_campaign(database, off)
    model2 = ScriptedBackend([BROKEN, other, BROKEN.replace("nx_wrong", "nx_third")])
    make_run(database, cid2, off, backend=model2).run()
    with database.session_scope() as s:
        assert all(v.origin is not VariantOrigin.REPAIR for v in repo.campaign_variants(s, cid2))
    database.close()


def test_the_campaign_tries_first_what_has_gained_and_reports_each_operator(
        finished: tuple[Path, int, CampaignRun]) -> None:

    from r3tui.engine.report import render

    db, cid, run = finished
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
        report = build_report(s, cid)
    children = [v for v in variants if v.origin is VariantOrigin.RULE]
    assert sum(y.proposals for y in report.operators.values()) == len(children)
    lines = render(report)
    for name, y in report.operators.items():
        assert f"  operator {name}: {y.proposals} proposed, {y.verified} verified, " \
               f"{y.improved} improved" in lines
    # the bandit's order for the next proposals: an operator that gained comes earlier on
    # average than one that was tried without gaining (this seeded run has both)
    gained = [n for n, y in report.operators.items() if y.improved]
    flat = [n for n, y in report.operators.items() if not y.improved]
    assert gained and flat, report.operators
    orders = [run._preference(100 + k, run.seed_source.text) for k in range(200)]
    assert all(o is not None and len(o) == len(set(o)) for o in orders)
    rank = {n: sum(o.index(n) for o in orders if o) / len(orders) for n in gained + flat}
    assert max(rank[n] for n in gained) < min(rank[n] for n in flat), rank
    run.settings = replace(run.settings, adaptive=False)
    assert run._preference(0, run.seed_source.text) is None


def test_a_change_of_comments_or_layout_only_is_a_duplicate_not_a_variant(
        tmp_path: Path) -> None:
    settings = model_settings(2, repair=False)
    database = open_database(tmp_path / "c.sqlite")
    cid = new_campaign(database, settings)
    comment_only = ("<<<<<<< SEARCH\n    long long sy = nx;\n=======\n"
                    "    long long sy = nx;  // the row stride\n\n>>>>>>> REPLACE\n")
    real = ("<<<<<<< SEARCH\n    long long sy = nx;\n=======\n    volatile long long sy = nx;\n"
            ">>>>>>> REPLACE\n")
    make_run(database, cid, settings, backend=ScriptedBackend([comment_only, real])).run()
    with database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
        events = repo.events(s, cid)
    assert [v.origin for v in variants] == [VariantOrigin.SEED, VariantOrigin.LLM]
    assert "volatile long long sy" in variants[1].source
    counted = [e.data for e in events if e.kind == "skipped" and e.data]
    assert sum(d["counts"].get("duplicate", 0) for d in counted) == 1
    database.close()


def test_a_generational_run_writes_the_repair_turns_of_failed_changes_first(
        tmp_path: Path) -> None:
    """--generate-only on the login node, `r3 evaluate` on the GPU node, then the next
    --generate-only: the model's changes that failed come back to it before new ones."""
    settings = model_settings(4)
    database = open_database(tmp_path / "g.sqlite")
    cid = new_campaign(database, settings)
    model = ScriptedBackend([BROKEN, FIXED, FIXED])

    def generator() -> CampaignRun:
        return CampaignRun(database, cid, settings, SOURCE, LAUNCH, DeviceLimits(),
                           make_mutator_from(settings, model), None)

    generator().generate(1)  # the seed and the broken change
    make_run(database, cid, settings).evaluate_pending()  # the GPU node (here: real NVRTC)
    (written,) = generator().generate(1)
    assert written.origin is VariantOrigin.REPAIR and written.status is VariantStatus.PENDING
    assert "It failed: compile_failed:" in model.prompts[1] and "nx_wrong" in model.prompts[1]
    make_run(database, cid, settings).evaluate_pending()
    (after,) = generator().generate(1)  # repaired once: a new proposal from the archive
    assert after.origin is VariantOrigin.LLM
    database.close()


def test_a_generational_run_compiles_the_models_changes_and_repairs_them_at_once(
        tmp_path: Path) -> None:
    """--generate-only with the recorded GPU's architecture: a change that does not compile
    (real NVRTC, on this machine without a GPU) is stored as compile_failed with the compiler's
    error and goes back to the model in the same run; its repair, which compiles, is what
    waits for the GPU node."""
    settings = model_settings(3)
    database = open_database(tmp_path / "g.sqlite")
    cid = new_campaign(database, settings)
    model = ScriptedBackend([BROKEN, FIXED, BROKEN.replace("nx_wrong", "nx_third")])
    run = CampaignRun(database, cid, settings, SOURCE, LAUNCH, DeviceLimits(),
                      make_mutator_from(settings, model), None)
    run.compile_arch = "sm_90"
    written = [v for v in run.generate(3) if v.origin is not VariantOrigin.SEED]
    assert [(v.origin, v.status) for v in written] == [
        (VariantOrigin.LLM, VariantStatus.COMPILE_FAILED),
        (VariantOrigin.REPAIR, VariantStatus.PENDING),
        (VariantOrigin.LLM, VariantStatus.COMPILE_FAILED)]
    broken, repaired, third = written
    assert "nx_third" in (third.status_reason or "")
    assert "nx_wrong" in (broken.status_reason or "") and repaired.parent_id == broken.id
    assert "It failed: compile_failed:" in model.prompts[1] and "nx_wrong" in model.prompts[1]
    # the line NVRTC's error names, quoted from the failed change, and recorded with the
    # repair (a re-run from recorded answers asks that very prompt)
    assert "is `long long sy = nx_wrong;`). Fix that failure" in model.prompts[1]
    assert "is `long long sy = nx_wrong;`)" in repaired.features["repair"]
    # with the generic format example (its names cannot be copied), recorded as asked
    assert "for example a change of another kind:" in model.prompts[1]
    assert repaired.features["repair_example"] == "generic"
    assert "repair_example" not in broken.features
    with database.session_scope() as s:
        stored = {v.id: v.status for v in repo.campaign_variants(s, cid)}
    assert stored[broken.id] is VariantStatus.COMPILE_FAILED
    assert stored[repaired.id] is VariantStatus.PENDING
    # without the architecture (a bundle that does not say) nothing is compiled here
    cid2 = new_campaign(database, settings)
    plain = CampaignRun(database, cid2, settings, SOURCE, LAUNCH, DeviceLimits(),
                        make_mutator_from(settings, ScriptedBackend([BROKEN])), None)
    (only,) = [v for v in plain.generate(1) if v.origin is not VariantOrigin.SEED]
    assert only.status is VariantStatus.PENDING
    database.close()


def test_a_generational_campaign_is_re_made_without_a_gpu_as_it_was_asked(
        tmp_path: Path) -> None:
    """Written in two rounds with the GPU node's evaluation between them: the first round's
    prompts saw the seed unmeasured, the second's its measurement.  A re-run from the recorded
    answers asks each as it was asked (not with measurements made after the call), so the
    tree is re-made instead of diverging at the first call."""
    from db import repository as repo_
    from r3tui.remix.recorded import RecordedBackend

    settings = model_settings(4, repair=False)
    database = open_database(tmp_path / "g.sqlite")
    cid = new_campaign(database, settings)
    other = FIXED.replace("nx_wrong", "nx").replace("volatile long long sy = nx;",
                                                     "volatile long long sy = nx + 0;")
    model = ScriptedBackend([BROKEN, FIXED.replace("nx_wrong", "nx"), other])

    def generator() -> CampaignRun:
        return CampaignRun(database, cid, settings, SOURCE, LAUNCH, DeviceLimits(),
                           make_mutator_from(settings, model), None)

    generator().generate(1)  # round 1: the seed not measured yet
    make_run(database, cid, settings).evaluate_pending()  # the GPU node (FAKE times)
    generator().generate(2)  # round 2: the seed measured
    assert "Measured" not in model.prompts[0] and "Measured" in model.prompts[1]
    with database.session_scope() as s:
        old = repo_.campaign_variants(s, cid)
        calls = [c for _, c in repo_.campaign_llm_calls(s, cid)]
    new = new_campaign(database, settings)
    rerun = CampaignRun(database, new, settings, SOURCE, LAUNCH, DeviceLimits(),
                        make_mutator_from(settings, RecordedBackend(calls)), None)
    assert replay_tree(rerun, cid, evaluate=False) == len(old) - 1 == 3
    with database.session_scope() as s:
        redo = repo_.campaign_variants(s, new)
    assert [(v.source, v.origin) for v in redo] == [(v.source, v.origin) for v in old]
    database.close()


def test_a_re_run_from_the_record_makes_the_repair_turns_again(tmp_path: Path) -> None:
    from db import repository as repo_
    from r3tui.remix.recorded import RecordedBackend

    settings = model_settings(3)
    database = open_database(tmp_path / "r.sqlite")
    cid = new_campaign(database, settings)
    other = BROKEN.replace("nx_wrong", "nx_other")
    make_run(database, cid, settings, backend=ScriptedBackend([BROKEN, FIXED, other])).run()
    with database.session_scope() as s:
        old = repo_.campaign_variants(s, cid)
        calls = [c for _, c in repo_.campaign_llm_calls(s, cid)]
    assert [v.origin for v in old].count(VariantOrigin.REPAIR) == 1
    new = new_campaign(database, settings)
    rerun = make_run(database, new, settings, backend=RecordedBackend(calls))
    assert replay_tree(rerun, cid) == len(old) - 1
    with database.session_scope() as s:
        redo = repo_.campaign_variants(s, new)
    assert [(v.source, v.origin, v.operator) for v in redo] == \
        [(v.source, v.origin, v.operator) for v in old]
    database.close()


@pytest.mark.parametrize(("capability", "arch"), [("9.0", "sm_90"), ("8.6", "sm_86"),
                                                  (None, None), ("", None), ("nine", None)])
def test_the_recorded_gpus_architecture_comes_from_the_bundles_provenance(
        capability: str | None, arch: str | None) -> None:
    from types import SimpleNamespace

    from r3tui.engine.unit_source import recorded_arch

    provenance = {} if capability is None else {"compute_capability": capability}
    bundle = SimpleNamespace(manifest=SimpleNamespace(provenance=provenance))
    assert recorded_arch(bundle) == arch  # type: ignore[arg-type]


def test_the_model_is_asked_first_for_changes_whose_pattern_the_kernel_has(
        tmp_path: Path) -> None:
    """stencil7 has no loop and no reduction: the model's first proposal names a catalogue
    entry whose pattern it has, and the variant keeps the order it was asked with (relevant
    first, as the bandit drew each part) for a re-run; rules-only, the order is the bandit's."""
    from r3tui.remix.catalogue import CATALOGUE, transformation
    from r3tui.remix.relevance import is_relevant

    settings = model_settings(1, repair=False)
    database = open_database(tmp_path / "r.sqlite")
    cid = new_campaign(database, settings)
    run = make_run(database, cid, settings, backend=ScriptedBackend([BROKEN]))
    run.run()
    with database.session_scope() as s:
        (asked,) = [v for v in repo.campaign_variants(s, cid) if v.origin is VariantOrigin.LLM]
    order = asked.features["preference"]
    fits = [is_relevant(transformation(n), SOURCE.text, "stencil7") for n in order]
    assert sorted(order) == sorted(t.name for t in CATALOGUE)
    assert fits == sorted(fits, reverse=True) and fits[0] and not fits[-1]
    assert asked.operator == order[0]
    database.close()
    rules_only = make_run(open_database(tmp_path / "o.sqlite"),
                          new_campaign(open_database(tmp_path / "o.sqlite")), SETTINGS)
    drawn = [rules_only._preference(k, SOURCE.text) for k in range(40)]
    assert any(o is not None and not is_relevant(transformation(o[0]), SOURCE.text,
                                                 "stencil7") for o in drawn)


@contextlib.contextmanager
def refusing_run(tmp_path: Path) -> Iterator[tuple[Database, int, CampaignRun]]:
    """A new campaign's run in a real database whose evaluator must not be reached (a
    variant refused before any compile)."""

    def never(*_args: object) -> None:
        raise AssertionError("a variant refused before any compile reached the evaluator")

    database = open_database(tmp_path / "r3.sqlite")
    try:
        cid = new_campaign(database)
        run = make_run(database, cid)
        run.evaluator_for = never  # type: ignore[assignment]
        yield database, cid, run
    finally:
        database.close()


def evaluate_stored(tmp_path: Path, text: str) -> StepReport:
    """``text`` stored as a pending model variant of a new campaign's seed, as another writer
    (or an older R³) would store it, unchecked, then evaluated by a :func:`refusing_run`."""
    from r3tui.domain import Variant, VariantOrigin

    with refusing_run(tmp_path) as (database, cid, run):
        seed = run.seed_variant()
        with database.session_scope() as s:
            vid = repo.add_variant(s, Variant(cid, text, VariantOrigin.LLM, parent_id=seed.id,
                                              operator="x"))
            variant = repo.get_variant(s, vid)
        assert variant is not None and variant.status is VariantStatus.PENDING
        return run.evaluate(variant)


def test_a_pending_variant_with_a_bad_first_line_fails_its_space_not_the_campaign(
        tmp_path: Path) -> None:
    """A variant another writer stored (its `// r3: first` line naming a value its tunable
    lacks) ends apply_failed with the reason, before any compile; the campaign goes on."""
    text = SOURCE.text.replace(
        "extern \"C\"", "// r3: tune R3_X 1 2 4\n// r3: first R3_X 8\nextern \"C\"", 1)
    assert text != SOURCE.text
    report = evaluate_stored(tmp_path, text)
    assert report.status is VariantStatus.APPLY_FAILED
    assert "first R3_X" in (report.reason or "") and "search space" in (report.reason or "")


def test_a_child_climbs_from_the_campaigns_best_and_the_original_does_not(
    finished: tuple[Path, int, CampaignRun],
) -> None:
    """A child's inner search climbs (lineage.Climb) from the archive's best time when it
    starts; the original's is the Bayesian search alone; a campaign stored before the
    setting existed re-runs without it."""
    from r3tui.engine import build_space
    from r3tui.errors import ConfigError

    db, cid, run = finished
    space = build_space(LAUNCH, SOURCE, SETTINGS.inner, DeviceLimits())
    best = run.state.archive.best()
    assert best is not None
    climb = run._climb(space, is_seed=False)
    assert climb is not None and climb.to_beat == best.fitness_s and climb.rounds == 3
    assert run._climb(space, is_seed=True) is None
    # a child whose change added a shared-memory tile may start CLIMB_SLACK behind the best
    from r3tui.engine.lineage import CLIMB_SLACK, adds_tile

    assert climb.slack == 1.0
    tiled = run._climb(space, False, frozenset({"R3_TILE"}), new_tile=True)
    assert tiled is not None and tiled.slack == CLIMB_SLACK
    _, coarse_tiled = _coarse_tiled_sgemm()
    _, _, tile_alone = _sgemm_child("tile_shared")
    _, _, coarse = _sgemm_child("coarsen")
    assert adds_tile(coarse, coarse_tiled) and adds_tile(None, tile_alone)
    assert not adds_tile(coarse_tiled, coarse_tiled) and not adds_tile(None, coarse)
    stored = {k: v for k, v in SETTINGS.to_json().items() if k != "climb"}
    assert CampaignSettings.from_json(stored).climb == 0
    with pytest.raises(ConfigError, match="--climb"):
        CampaignSettings(climb=-1)
    with open_database(db) as database:
        off = make_run(database, cid, replace(SETTINGS, climb=0))
        assert off._climb(space, is_seed=False) is None


def test_a_child_that_beats_the_best_climbs_while_its_factors_gain(tmp_path: Path) -> None:
    """Times that follow the rules' factors (FactorCostEvaluator, a named fake: 4 is best): a
    child whose first trials beat the campaign's best tries its best with each factor one
    value up and down, trial budget grown by as many, until a round gains nothing."""
    settings = replace(SETTINGS, variants=6, seed=2)
    database = open_database(tmp_path / "climb.sqlite")
    cid, _ = _rules_campaign(database, settings, SOURCE, LAUNCH, FactorCostEvaluator)
    with database.session_scope() as s:
        done = {e.data["variant_id"]: e.data for e in repo.events(s, cid)
                if e.kind == "inner_done" and e.data}
        tree = {v.id: v for v in repo.campaign_tree(s, cid)}
        trials = {vid: repo.finished_trials(s, cid, variant_id=vid) for vid in done}
    climbed = {vid: data for vid, data in done.items() if data["climbed"]}
    assert climbed, "no child climbed"
    for vid, data in climbed.items():
        assert len(trials[vid]) == settings.inner_trials + data["climbed"]
        assert tree[vid].parent_id is not None  # a child, never the original
        # it ends where each of its factors is best (4), from the 2 its first steps tried
        factors = data["winner"]["tunables"]
        assert factors and set(factors.values()) == {4}, factors
    # the report says what the climbs added: each climber's best before and after
    with database.session_scope() as s:
        report = build_report(s, cid)
    assert report.climbs.children == len(climbed)
    assert report.climbs.trials == sum(d["climbed"] for d in climbed.values())
    for vid, (before, after) in report.climbs.gains.items():
        times = [t.measurement.time.median_s for t in trials[vid] if t.measurement.time]
        assert after == min(times) <= before  # a round may gain nothing
        assert before == min(times[: settings.inner_trials])
    gain = report.climbs.best_gain
    assert gain is not None
    assert any(line.startswith(f"climbs from a child's best: {len(climbed)} child")
               and f"variant #{gain[0]}" in line for line in render(report))


def test_neighbours_move_each_tunable_one_value_up_then_down() -> None:
    """sgemm coarsened along x and y, then tiled: from two by two outputs a thread with a
    contiguous tile of 64, double-buffered (where session 40's tiled children stopped), the
    moves up come first, and each launches with the shared memory its tile needs."""
    from r3tui.domain import TrialConfig
    from r3tui.engine.lineage import neighbours

    space, _ = _coarse_tiled_sgemm()
    best = {"R3_CF_X": 2, "R3_CF_Y": 2, "R3_X_CONTIGUOUS": 1, "R3_TILE": 64, "R3_STAGES": 2,
            "R3_EDGE_TILES": 0}
    moved = neighbours(space, TrialConfig(tunables=best, block=Dim3(16, 8)))
    defaults = {t.name: t.default for t in space.tunables}
    changes = [{k: c.tunables.get(k, defaults[k]) for k in best
                if c.tunables.get(k, defaults[k]) != best[k]} for c in moved]
    assert changes == [{"R3_CF_X": 4}, {"R3_CF_Y": 4}, {"R3_TILE": 128},  # up
                       {"R3_EDGE_TILES": 1},
                       {"R3_CF_X": 1}, {"R3_CF_Y": 1}, {"R3_X_CONTIGUOUS": 0},
                       {"R3_TILE": 32}, {"R3_STAGES": 1}]
    assert all(c.block == Dim3(16, 8) and space.from_config(c) is not None for c in moved)
    # each launches with its tiles' bytes: per stage, a tile of blockDim.y * R3_CF_Y rows of
    # A and one of blockDim.x * R3_CF_X columns of B, R3_TILE floats deep
    def tiles(c: TrialConfig) -> int:
        v = {**defaults, **c.tunables}
        return int(v["R3_STAGES"]) * (8 * int(v["R3_CF_Y"]) + 16 * int(v["R3_CF_X"])) \
            * int(v["R3_TILE"]) * 4

    assert [c.shared_mem_bytes for c in moved] == [tiles(c) for c in moved]
    assert [c.shared_mem_bytes for c in moved][:3] == [40960, 32768, 49152]


def test_block_moves_double_or_halve_one_axis_where_the_tiles_still_fit() -> None:
    """From the recorded 16x16, two by four outputs with two stages of tiles of 64 fill 48 KiB:
    32x16 and 16x32 need 64 KiB and are no points of the space; from 16x8 every axis moves,
    the recorded block among them (as None), each with its tiles' bytes."""
    from r3tui.domain import TrialConfig
    from r3tui.engine.lineage import block_moves

    space, _ = _coarse_tiled_sgemm()
    best = TrialConfig(tunables={"R3_CF_X": 2, "R3_CF_Y": 4, "R3_TILE": 64, "R3_STAGES": 2})
    assert [(c.block, c.shared_mem_bytes) for c in block_moves(space, best)] == [
        (Dim3(8, 16), 2 * (16 * 4 + 8 * 2) * 64 * 4), (Dim3(16, 8), 2 * (8 * 4 + 16 * 2) * 64 * 4)]
    assert [c.block for c in block_moves(space, replace(best, block=Dim3(16, 8)))] == [
        Dim3(32, 8), Dim3(8, 8), None, Dim3(16, 4)]
    assert all(c.tunables == best.tunables for c in block_moves(space, best))


def _rules_campaign(database: Database, settings: CampaignSettings, source: KernelSource,
                    launch: LaunchInfo, evaluator: type) -> tuple[int, CampaignRun]:
    """A rules-only campaign of ``source`` run to its end with a fake replay ``evaluator``."""
    cid = new_campaign(database, settings)
    run = CampaignRun(database, cid, settings, source, launch, DeviceLimits(),
                      make_mutator_from(settings, None), evaluator)
    run.run()
    return cid, run


def _sgemm_campaign(tmp_path: Path, **changes: object) -> list:
    """A rules-only campaign on sgemm (recorded 16x16 over 1024x1024) with a fake replay."""
    sgemm = KernelSource((REPO / "examples/sgemm/kernel.cu").read_text(), "sgemm")
    launch = LaunchInfo(grid=Dim3(64, 64), block=Dim3(16, 16), work=Dim3(1024, 1024),
                        block_tunable=True)
    settings = replace(SETTINGS, variants=6, inner_trials=2, seed_trials=3, **changes)
    tmp_path.mkdir(parents=True, exist_ok=True)
    database = open_database(tmp_path / "c.sqlite")
    cid, _ = _rules_campaign(database, settings, sgemm, launch, CompiledCostEvaluator)
    with database.session_scope() as s:
        variants = repo.campaign_variants(s, cid)
    database.close()
    return variants


def test_a_register_blocked_child_is_followed_at_once_by_a_tile_of_its_loop(
        tmp_path: Path) -> None:
    """Register blocking enables a shared-memory tile of the blocked loop
    (Transformation.enables): each register-blocked variant that replays right gets that tile
    as the next proposal, on it, whatever its own time.  One of session 45's six sgemm
    campaigns never tiled a blocked variant (645.6 us against 235-352 us)."""
    from r3tui.engine.lineage import EVALUATED_OK
    from r3tui.remix.catalogue import CATALOGUE, transformation

    assert all(transformation(t.enables) for t in CATALOGUE if t.enables)
    variants = _sgemm_campaign(tmp_path / "on", seed=3)
    order = [v.id for v in variants]
    blocked = [v for v in variants if v.operator == "register_blocking"
               and v.origin is VariantOrigin.RULE and v.status in EVALUATED_OK]
    assert blocked, [(v.operator, v.status) for v in variants]
    for b in blocked:
        after = variants[order.index(b.id) + 1]
        assert (after.parent_id, after.operator) == (b.id, "shared_memory_tile"), after
        assert "R3_TILE" in after.source and "R3_CF_X" in after.source
    off = _sgemm_campaign(tmp_path / "off", seed=3, follow_up=False)
    assert not any(v.operator == "shared_memory_tile" and v.parent_id is not None
                   and any(b.id == v.parent_id and b.operator == "register_blocking"
                           for b in off) for v in off)
    assert CampaignSettings.from_json({"variants": 1}).follow_up is False  # stored before it


def test_a_follow_up_is_the_rules_change_even_where_the_model_makes_every_proposal(
        tmp_path: Path) -> None:
    import random

    from r3tui.domain import Variant
    from r3tui.engine.proposals import ProposalRequest
    from r3tui.remix.rules import apply_rule

    settings = model_settings(2)  # every proposal to the model
    database = open_database(tmp_path / "c.sqlite")
    cid = new_campaign(database, settings)
    model = ScriptedBackend([])
    run = make_run(database, cid, settings, backend=model)
    text = (REPO / "examples/sgemm/kernel.cu").read_text()
    blocked = next(c.source for c in (apply_rule("coarsen", text, "sgemm", random.Random(s))
                                      for s in range(20))
                   if c.source and "R3_CF_X" in c.source and "R3_CF_Y" in c.source)
    parent = Variant(cid, blocked, VariantOrigin.RULE, operator="register_blocking", id=1)
    run.seed_source = KernelSource(text, "sgemm")
    proposal, _ = run.generate_proposal(ProposalRequest(
        7, 0, parent, None, (), transformation="shared_memory_tile"))
    assert proposal.ok and proposal.origin is VariantOrigin.RULE, proposal
    assert "R3_TILE" in (proposal.source or "") and model.prompts == []
    database.close()
