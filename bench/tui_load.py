"""How fast the TUI opens a big campaign and shows a live update.

    python bench/tui_load.py [--variants 10000] [--trials 200000] [--db PATH]

Generates (or reuses, with --db) a database of one campaign with that many variants and
trials (tests/ui/factories.py: a real SQLite file with the engine's schema and shapes), then,
in a headless Textual app of 160x48:

- ``tui_open_s``: from app start to the campaign screen with its tree visible (roots and the
  seed's first page of children on screen), opened with ``--campaign``;
- ``tui_refresh_ms``: a writer (another connection, as the engine is another process) adds
  a variant under the seed; time until its line is in the tree; median and max of 10;
- ``tui_key_ms``: mean time per cursor move over 200 moves down the tree while it polls
  (Pilot's own waiting included), and ``ui_stall_max_ms``, the longest gap of a 10 ms
  heartbeat on the UI thread meanwhile: the longest the UI was unresponsive.

The baseline in the same run is the bare cost: ``db_query_open_ms`` is the time of the
queries behind the first screen (header, roots, first page) outside the UI, so the ratio
says how much the UI adds.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from db import browse, series
from db.session import open_database
from r3tui.ui.app import R3App
from r3tui.ui.screens.campaign import CampaignScreen
from r3tui.ui.widgets.variant_tree import VariantTree
from tests.ui.factories import CampaignSpec, add_live_variant, build_database


def machine() -> str:
    import os

    py = platform.python_version()
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python {py}, "
        f"load average {load} (shared machine)"
    )


def shown(tree: VariantTree) -> set[int]:
    out: set[int] = set()

    def walk(node: object) -> None:
        for child in node.children:  # type: ignore[attr-defined]
            if child.data is not None and child.data.node is not None:
                out.add(child.data.node.id)
                if child.is_expanded:
                    walk(child)

    walk(tree.root)
    return out


async def measure(db: Path, campaign_id: int, seed_id: int) -> dict[str, float]:
    start = time.perf_counter()
    app = R3App(db, campaign_id=campaign_id, poll_interval_s=0.25, cursor_blink=False)
    out: dict[str, float] = {}
    async with app.run_test(size=(160, 48)) as pilot:
        while not (isinstance(app.screen, CampaignScreen) and app.screen.tree_shown_at):
            await pilot.pause(0.005)
        screen = app.screen
        assert screen.tree_shown_at is not None
        # the moment after the refresh that drew the first page of the tree
        out["tui_open_s"] = screen.tree_shown_at - start
        out["tree_lines"] = len(shown(screen.query_one(VariantTree)))
        # steady state first: the first poll sums every trial (totals, convergence)
        while screen.stats.n_trials == 0:
            await pilot.pause(0.005)
        out["tui_totals_s"] = time.perf_counter() - start
        tree = screen.query_one(VariantTree)
        writer = open_database(db)
        try:
            latencies = []
            for k in range(10):
                box: dict[str, float | int] = {}

                def write(k: int = k, box: dict[str, float | int] = box) -> None:
                    box["id"] = add_live_variant(writer, campaign_id, seed_id, 90_000 + k)
                    box["at"] = time.perf_counter()

                thread = threading.Thread(target=write)
                thread.start()
                while "at" not in box or box["id"] not in shown(tree):
                    await pilot.pause(0.005)
                latencies.append((time.perf_counter() - float(box["at"])) * 1000)
                thread.join()
                await pilot.pause(0.3)
        finally:
            writer.close()
        out["tui_refresh_ms"] = statistics.median(latencies)
        out["tui_refresh_max_ms"] = max(latencies)
        tree.focus()
        # a heartbeat on the UI thread: its longest gap is the longest time the UI was stuck
        beats: list[float] = []
        timer = app.set_interval(0.01, lambda: beats.append(time.perf_counter()))
        t0 = time.perf_counter()
        for _ in range(200):
            await pilot.press("down")
        out["tui_key_ms"] = (time.perf_counter() - t0) * 1000 / 200
        timer.stop()
        out["ui_stall_max_ms"] = max(b - a for a, b in itertools.pairwise(beats)) * 1000
    return out


def query_baseline(db: Path, campaign_id: int) -> float:
    database = open_database(db, readonly=True)
    try:
        t0 = time.perf_counter()
        with database.session_scope() as s:
            browse.campaign_header(s, campaign_id)
            roots = browse.child_page(s, campaign_id, None)
            browse.child_page(s, campaign_id, roots.nodes[0].id)
        return (time.perf_counter() - t0) * 1000
    finally:
        database.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", type=int, default=10_000)
    parser.add_argument("--trials", type=int, default=200_000)
    parser.add_argument("--db", type=Path, help="reuse this generated database")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    print(f"command: python bench/tui_load.py {' '.join(sys.argv[1:])}".rstrip())
    if args.db and args.db.exists():
        db = args.db
        print(f"database: {db} (reused)")
    else:
        import tempfile

        db = args.db or Path(tempfile.mkdtemp(prefix="r3-tui-load-")) / "r3.sqlite"
        t0 = time.perf_counter()
        spec = CampaignSpec(name="load", n_variants=args.variants, n_trials=args.trials, islands=4)
        build_database(db, (spec,))
        print(f"database: {db} generated in {time.perf_counter() - t0:.1f} s")
    database = open_database(db, readonly=True)
    with database.session_scope() as s:
        header = browse.campaign_header(s, 1)
        roots = browse.child_page(s, 1, None)
        n_trials = series.campaign_stats(s, 1).n_trials
    database.close()
    assert header is not None
    print(
        f"size: {header.n_variants} variants, {n_trials} trials, {db.stat().st_size / 1e6:.0f} MB"
    )
    baseline = query_baseline(db, 1)
    result = asyncio.run(measure(db, 1, roots.nodes[0].id))
    print(f"db_query_open_ms: {baseline:.1f}")
    print(f"tui_open_s: {result['tui_open_s']:.3f}")
    print(f"ratio tui_open / db queries: {result['tui_open_s'] * 1000 / baseline:.1f}x")
    print(f"tree lines on screen at open: {result['tree_lines']:.0f}")
    print(f"tui_totals_s: {result['tui_totals_s']:.3f} (status bar totals and plot loaded)")
    refresh, worst = result["tui_refresh_ms"], result["tui_refresh_max_ms"]
    print(f"tui_refresh_ms: {refresh:.0f} (median of 10, max {worst:.0f}; poll every 250 ms)")
    print(f"tui_key_ms: {result['tui_key_ms']:.1f} (mean of 200 cursor moves, Pilot included)")
    print(f"ui_stall_max_ms: {result['ui_stall_max_ms']:.0f} (longest UI-thread gap meanwhile)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
