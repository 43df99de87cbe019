"""The MAP-Elites archive: insertion, selection, inspirations, migration, resume."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from r3tui.domain import EliteCell
from r3tui.search import (
    DEFAULT_FEATURES,
    ArchiveSettings,
    Elite,
    EliteArchive,
    FeatureDim,
    cell_coordinates,
    cell_key,
    describe,
)

FAMILY_TEXT = st.sampled_from(
    ["seed", "memory", "tiling", "loops", "parallelism", "tuning", "Tiling ", "fusion", ""]
)
FEATURES = st.builds(
    describe,
    registers=st.none() | st.integers(0, 255),
    shared_mem_bytes=st.none() | st.integers(0, 96 * 1024),
    occupancy=st.none() | st.floats(0.0, 1.0),
    family=FAMILY_TEXT,
)
FITNESS = st.sampled_from([1e-4, 2e-4]) | st.floats(1e-6, 1e-2, allow_nan=False)
# (island, variant id, features, fitness): variant ids unique, as the database makes them.
OFFERS = st.lists(st.tuples(st.integers(0, 2), FEATURES, FITNESS), max_size=60).map(
    lambda rows: [(island, i + 1, f, t) for i, (island, f, t) in enumerate(rows)]
)
Offers = list[tuple[int, int, dict[str, Any], float]]
THREE = ArchiveSettings(islands=3, migrants=2, inspirations=3)


def filled(
    offers: Offers,
    archive_settings: ArchiveSettings = THREE,
) -> EliteArchive:
    archive = EliteArchive(archive_settings)
    for island, variant_id, features, fitness in offers:
        archive.offer(island, variant_id, features, fitness)
    return archive


# -- cells --------------------------------------------------------------------------------
def test_cell_key_is_stable_text_in_declared_order() -> None:
    features = describe(registers=40, shared_mem_bytes=0, occupancy=0.5, family="tiling")
    assert cell_key(features) == "regs=1|smem=0|grain=0|family=tiling"
    assert cell_key(dict(reversed(list(features.items())))) == \
        "regs=1|smem=0|grain=0|family=tiling"
    assert cell_coordinates("regs=1|smem=0|grain=0|family=tiling") == {
        "regs": "1",
        "smem": "0",
        "grain": "0",
        "family": "tiling",
    }


def test_vectorized_and_coarsened_variants_fall_in_cells_of_their_own() -> None:
    # issue #19: the archive's dimensions reflect vector width and work per thread
    def grain(vector_width: int, work_per_thread: int) -> str:
        features = describe(40, 0, 0.5, "memory", vector_width=vector_width,
                            work_per_thread=work_per_thread)
        assert features["elements_per_thread"] == vector_width * work_per_thread
        return cell_coordinates(cell_key(features))["grain"]

    assert (grain(1, 1), grain(4, 1), grain(1, 2), grain(4, 4), grain(1, 8)) == (
        "0", "1", "1", "2", "2")
    assert cell_coordinates(cell_key({"registers": 40, "family": "memory"}))["grain"] == \
        "na"  # features stored before the dimension existed
    with pytest.raises(ValueError, match="work_per_thread"):
        describe(40, 0, 0.5, "memory", work_per_thread=0)


@pytest.mark.parametrize(
    ("registers", "label"),
    [
        (0, "0"),
        (32, "0"),
        (33, "1"),
        (64, "1"),
        (65, "2"),
        (128, "2"),
        (129, "3"),
        (255, "3"),
        (None, "na"),
    ],
)
def test_register_bins_have_inclusive_upper_edges(registers: int | None, label: str) -> None:
    features = describe(registers, 0, None, "seed")
    assert cell_coordinates(cell_key(features))["regs"] == label


@pytest.mark.parametrize(
    ("smem", "label"), [(0, "0"), (1, "1"), (16 * 1024, "1"), (16 * 1024 + 1, "2"), (None, "na")]
)
def test_shared_memory_bins_separate_none_small_and_large(smem: int | None, label: str) -> None:
    assert cell_coordinates(cell_key(describe(20, smem, None, "seed")))["smem"] == label


def test_unknown_family_falls_into_other_and_case_is_ignored() -> None:
    assert cell_key(describe(20, 0, None, "fusion")).endswith("family=other")
    assert cell_key(describe(20, 0, None, " Memory")).endswith("family=memory")


def test_bin_labels_read_as_ranges() -> None:
    regs = DEFAULT_FEATURES[0]
    assert [regs.describe_label(x) for x in regs.labels()] == [
        "<=32",
        "32<..<=64",
        "64<..<=128",
        ">128",
        "na",
    ]


@given(FEATURES)
def test_cell_key_round_trips_through_its_coordinates(features: dict[str, object]) -> None:
    key = cell_key(features)
    coords = cell_coordinates(key)
    assert "|".join(f"{k}={v}" for k, v in coords.items()) == key
    assert cell_key(features) == key


def test_feature_dims_reject_malformed_declarations() -> None:
    with pytest.raises(ValueError):
        FeatureDim("regs", "bins", edges=(64, 32))
    with pytest.raises(ValueError):
        FeatureDim("a|b", "categories", categories=("x",))
    with pytest.raises(ValueError):
        FeatureDim("fam", "categories", categories=("x", "x"))
    with pytest.raises(ValueError):
        cell_key({"registers": "many"})
    with pytest.raises(ValueError):
        cell_coordinates("regs=9|smem=0|grain=0|family=seed")


def test_describe_validates_raw_values() -> None:
    with pytest.raises(ValueError):
        describe(-1, 0, None, "seed")
    with pytest.raises(ValueError):
        describe(32, 0, 1.5, "seed")


def test_settings_round_trip_through_json() -> None:
    custom = ArchiveSettings(
        islands=4,
        exploit=0.5,
        features=(FeatureDim("occ", "bins", edges=(0.25, 0.5), descriptor="occupancy"),),
    )
    assert ArchiveSettings.from_json(custom.to_json()) == custom
    assert ArchiveSettings.from_json({}) == ArchiveSettings()
    with pytest.raises(ValueError):
        ArchiveSettings(exploit=1.5)


# -- insertion ----------------------------------------------------------------------------
@given(OFFERS)
def test_each_cell_holds_the_fastest_variant_offered_to_it(offers: Offers) -> None:
    archive = filled(offers)
    expected: dict[tuple[int, str], tuple[float, int]] = {}
    for island, variant_id, features, fitness in offers:
        slot = (island, cell_key(features))
        expected[slot] = min(expected.get(slot, (math.inf, 0)), (fitness, variant_id))
    got = {(e.island, e.cell_key): (e.fitness_s, e.variant_id) for e in archive.elites()}
    assert got == expected
    if offers:
        best = archive.best()
        assert best is not None
        assert (best.fitness_s, best.variant_id) == min((t, v) for _, v, _, t in offers)


def test_offer_reports_what_happened_and_ties_go_to_the_lower_variant_id() -> None:
    archive = EliteArchive(ArchiveSettings(islands=1))
    features = describe(40, 0, None, "tiling")
    first = archive.offer(0, 7, features, 2e-4)
    assert first == Elite(0, "regs=1|smem=0|grain=0|family=tiling", 7, 2e-4)
    assert archive.offer(0, 9, features, 3e-4) is None  # slower: loses
    assert archive.offer(0, 8, features, 2e-4) is None  # tie, higher id: loses
    assert archive.offer(0, 3, features, 2e-4) is not None  # tie, lower id: wins
    faster = archive.offer(0, 10, features, 1e-4)
    assert faster is not None and faster.features == features
    assert [e.variant_id for e in archive.elites()] == [10]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1e-6])
def test_offer_rejects_unusable_fitness(bad: float) -> None:
    archive = EliteArchive(ArchiveSettings(islands=1))
    with pytest.raises(ValueError):
        archive.offer(0, 1, describe(32, 0, None, "seed"), bad)
    with pytest.raises(ValueError):
        archive.offer(1, 1, describe(32, 0, None, "seed"), 1e-4)  # no such island
    assert len(archive) == 0


# -- selection ----------------------------------------------------------------------------
@given(OFFERS, st.integers(0, 2**32), st.integers(0, 2))
def test_selection_only_returns_elites_of_the_island(
    offers: Offers,
    seed: int,
    island: int,
) -> None:
    archive = filled(offers)
    rng = random.Random(seed)
    mine = archive.elites(island)
    for _ in range(5):
        parent = archive.select_parent(island, rng)
        if not mine:
            assert parent is None
            continue
        assert parent in mine
        others = archive.inspirations(island, parent, rng)
        assert all(o in mine for o in others)
        assert parent.variant_id not in {o.variant_id for o in others}
        assert len({o.variant_id for o in others}) == len(others)
        assert len(others) == min(THREE.inspirations, len(mine) - 1)


def test_exploit_picks_among_the_fittest_and_explore_reaches_every_cell() -> None:
    archive = EliteArchive(ArchiveSettings(islands=1, exploit=1.0, fittest=2))
    for i, family in enumerate(["seed", "memory", "tiling", "loops", "tuning"]):
        archive.offer(0, i + 1, describe(32, 0, None, family), (i + 1) * 1e-4)
    rng = random.Random(0)
    picks = {archive.select_parent(0, rng).variant_id for _ in range(200)}  # type: ignore[union-attr]
    assert picks == {1, 2}
    explorer = EliteArchive.rebuild(ArchiveSettings(islands=1, exploit=0.0), archive.elites())
    picks = {explorer.select_parent(0, rng).variant_id for _ in range(200)}  # type: ignore[union-attr]
    assert picks == {1, 2, 3, 4, 5}


def test_inspirations_lead_with_the_fastest_other_cells() -> None:
    archive = EliteArchive(ArchiveSettings(islands=1))
    for i, family in enumerate(["seed", "memory", "tiling", "loops", "tuning", "parallelism"]):
        archive.offer(0, i + 1, describe(32, 0, None, family), (i + 1) * 1e-4)
    parent = next(e for e in archive.elites(0) if e.variant_id == 1)
    got = archive.inspirations(0, parent, random.Random(1), k=4)
    assert [e.variant_id for e in got[:2]] == [2, 3]  # best of the other cells
    assert len(got) == 4 and 1 not in {e.variant_id for e in got}
    assert archive.inspirations(0, parent, random.Random(1), k=0) == []


def test_children_go_round_robin_over_islands() -> None:
    archive = EliteArchive(ArchiveSettings(islands=3))
    assert [archive.island_for(n) for n in range(7)] == [0, 1, 2, 0, 1, 2, 0]


# -- resume -------------------------------------------------------------------------------
@given(OFFERS, st.integers(0, 2**32))
def test_rebuilt_archive_equals_and_chooses_like_the_original(offers: Offers, seed: int) -> None:
    archive = filled(offers)
    stored = [
        EliteCell(1, e.island, e.cell_key, e.variant_id, e.fitness_s)
        for e in reversed(archive.elites())
    ]  # rows come back in any order
    for rebuilt in (
        EliteArchive.rebuild(THREE, archive.elites()),
        EliteArchive.rebuild(THREE, stored),
    ):
        assert rebuilt == archive
        a, b = random.Random(seed), random.Random(seed)
        for n in range(6):
            island = archive.island_for(n)
            pa, pb = archive.select_parent(island, a), rebuilt.select_parent(island, b)
            assert pa == pb
            if pa is not None and pb is not None:
                assert archive.inspirations(island, pa, a) == rebuilt.inspirations(island, pb, b)
        assert archive.migrate(random.Random(seed)) == rebuilt.migrate(random.Random(seed))
        assert rebuilt == archive
        archive = filled(offers)


def test_rebuild_refuses_cells_of_other_feature_settings() -> None:
    with pytest.raises(ValueError):
        EliteArchive.rebuild(ArchiveSettings(islands=1), [EliteCell(1, 0, "occ=1", 5, 1e-4)])
    with pytest.raises(ValueError):
        EliteArchive.rebuild(
            ArchiveSettings(islands=1),
            [EliteCell(1, 3, "regs=0|smem=0|grain=0|family=seed", 5, 1e-4)]
        )


def test_to_cells_are_the_rows_rebuild_reads() -> None:
    archive = filled(
        [
            (0, 1, describe(20, 0, None, "seed"), 1e-4),
            (2, 2, describe(90, 4096, 0.5, "tiling"), 5e-5),
        ]
    )
    rows = archive.to_cells(campaign_id=4)
    assert rows == [
        EliteCell(4, 0, "regs=0|smem=0|grain=0|family=seed", 1, 1e-4),
        EliteCell(4, 2, "regs=2|smem=1|grain=0|family=tiling", 2, 5e-5),
    ]
    assert EliteArchive.rebuild(THREE, rows) == archive


# -- migration ----------------------------------------------------------------------------
@given(OFFERS, st.integers(0, 2**32))
@settings(max_examples=150)
def test_migration_copies_along_the_ring_and_never_loses_an_elite(
    offers: Offers,
    seed: int,
) -> None:
    archive = filled(offers)
    before = {(e.island, e.cell_key): e for e in archive.elites()}
    moved = archive.migrate(random.Random(seed))
    after = {(e.island, e.cell_key): e for e in archive.elites()}
    for slot, elite in before.items():  # every cell still filled, never by a slower variant
        assert slot in after
        assert (after[slot].fitness_s, after[slot].variant_id) <= (
            elite.fitness_s,
            elite.variant_id,
        )
    for copy, destination in moved:
        assert copy.island == destination
        assert after[(destination, copy.cell_key)] == copy
        source = (destination - 1) % THREE.islands
        assert before[(source, copy.cell_key)].variant_id == copy.variant_id  # a copy, same id
    for slot, elite in after.items():  # anything new came from the previous island
        if before.get(slot) != elite:
            assert (elite, slot[0]) in moved
    sources = {(c.island - 1) % THREE.islands for c, _ in moved}
    for island in sources:  # an island sends at most `migrants` elites, its fastest first
        sent = [c for c, _ in moved if (c.island - 1) % THREE.islands == island]
        assert len(sent) <= THREE.migrants


def test_migration_sends_the_fastest_elite_to_the_next_island() -> None:
    archive = EliteArchive(ArchiveSettings(islands=3, migrants=1))
    archive.offer(0, 1, describe(20, 0, None, "seed"), 3e-4)
    archive.offer(0, 2, describe(20, 0, None, "tiling"), 1e-4)
    archive.offer(2, 3, describe(20, 0, None, "seed"), 2e-4)
    moved = archive.migrate(random.Random(0))
    assert moved == [
        (Elite(1, "regs=0|smem=0|grain=0|family=tiling", 2, 1e-4), 1),
        (Elite(0, "regs=0|smem=0|grain=0|family=seed", 3, 2e-4), 0),
    ]
    assert archive.elites(0)[0].variant_id == 3  # island 2's faster seed displaced island 0's
    assert [e.variant_id for e in archive.elites(1)] == [2]


def test_migration_is_due_every_interval_and_only_with_several_islands() -> None:
    archive = EliteArchive(ArchiveSettings(islands=2, migration_interval=10))
    assert [n for n in range(35) if archive.due_migration(n)] == [10, 20, 30]
    single = EliteArchive(ArchiveSettings(islands=1))
    assert not any(single.due_migration(n) for n in range(35))
    assert single.migrate(random.Random(0)) == []
