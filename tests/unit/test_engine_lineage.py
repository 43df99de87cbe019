"""A variant's fitness (r3tui.engine.lineage.fitness_of) on a real SQLite database: its shared
memory counts the dynamic bytes its best trial launched with, so a tiled variant (whose tiles
are dynamic shared memory, `// r3: shared`) lands in the archive's shared-memory bins and its
occupancy is the one it runs at."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from db import repository as repo
from db.session import open_database
from r3tui.domain import Dim3, Variant, VariantOrigin
from r3tui.engine.lineage import fitness_of
from r3tui.search.occupancy import occupancy
from tests.db.factories import config, ok, seed_campaign


def test_fitness_counts_the_dynamic_shared_memory_its_trial_launched_with(
        tmp_path: Path) -> None:
    database = open_database(tmp_path / "r3.sqlite", create=True, upgrade=True)
    with database.session_scope() as s:
        _rid, cid, seed = seed_campaign(s)
        tiled = repo.add_variant(s, Variant(cid, "// tiled", VariantOrigin.RULE, parent_id=seed))
        repo.insert_trial(s, cid, seed, config(block=256), ok(2e-4))
        repo.insert_trial(s, cid, tiled, replace(config(block=256), shared_mem_bytes=40960),
                          ok(1e-4))
    with database.session_scope() as s:
        plain = fitness_of(s, repo.get_variant(s, seed), Dim3(32))
        staged = fitness_of(s, repo.get_variant(s, tiled), Dim3(32))
        recorded = fitness_of(s, repo.get_variant(s, seed), Dim3(32), dynamic_shared=128)
    assert plain is not None and staged is not None and recorded is not None
    assert plain.shared_mem_bytes == 0
    assert staged.shared_mem_bytes == 40960  # static 0 + the trial's own 40 KiB
    assert recorded.shared_mem_bytes == 128  # the recorded launch's bytes
    assert staged.occupancy == occupancy(256, 32, 40960)
    assert staged.occupancy is not None and plain.occupancy is not None
    assert staged.occupancy < plain.occupancy  # fewer blocks fit an SM
