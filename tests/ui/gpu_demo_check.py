"""The GPU half of ``r3 demo``, headless: record an example, launch the real engine from the
TUI, watch the tree grow, stop it.  Run on a GPU node (not collected by pytest):

    python tests/ui/gpu_demo_check.py [OUT_DIR]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from r3tui.cli.demo import demo_request, gpu_available, record_example
from r3tui.ui.app import R3App
from r3tui.ui.screens.campaign import CampaignScreen
from tests.ui.conftest import text_of, visible_variants


async def watch(db: Path, bundle: Path, out: Path) -> int:
    request = demo_request("stencil7", bundle, db, "6", "--inner-budget 8 --seed-budget 16")
    app = R3App(db, launch=request, cursor_blink=False)
    start = time.monotonic()
    async with app.run_test(size=(160, 48)) as pilot:
        while not isinstance(app.screen, CampaignScreen):
            await pilot.pause(0.1)
            process = next(iter(app.processes.values()), None)
            if process is not None and process.failure():
                print("engine failed:", process.failure())
                return 1
            if time.monotonic() - start > 120:
                print("no campaign screen after 120 s")
                return 1
        print(f"campaign screen after {time.monotonic() - start:.1f} s")
        screen = app.screen
        engine = next(iter(app.processes.values()))
        while len(visible_variants(app)) < 3 and time.monotonic() - start < 300:
            if not engine.running:  # a short campaign: let the last poll land
                await pilot.pause(2)
                break
            await pilot.pause(0.5)
        await pilot.pause(1)
        bar = text_of(screen.query_one("#status-bar")).strip()
        print(
            f"after {time.monotonic() - start:.1f} s: {len(visible_variants(app))} variants shown"
        )
        print("status:", bar)
        app.save_screenshot(str(out / "demo-campaign.svg"))
        await pilot.press("X")
        process = next(iter(app.processes.values()))
        code = await asyncio.get_running_loop().run_in_executor(None, process.wait, 120)
        await pilot.pause(1.0)
        print("engine exit:", code, "| status:", text_of(screen.query_one("#status-bar")).strip())
        print("engine last stderr:", process.last_error_line())
    return 0


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    print("gpu_available:", gpu_available())
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "r3-demo.sqlite"
        t0 = time.monotonic()
        bundle = record_example("stencil7", Path(tmp), db)
        print(f"recorded {bundle.name} in {time.monotonic() - t0:.1f} s")
        return asyncio.run(watch(db, bundle, out))


if __name__ == "__main__":
    raise SystemExit(main())
