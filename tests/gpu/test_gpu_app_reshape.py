"""An application kernel whose host code builds its block in a variable, on the GPU.

tests/gpu/apps/rows_app (written here) launches a 2-D elimination step in the shape of Rodinia
gaussian's Fan2 with blocks of 4x4 threads from ``dim3 block(side, side)``.  The launch written
by `r3 apply` for another block (``r3_shaped_grid``), with the kernel's thread axes exchanged
(rule ``swap_xy``, valid since its work is square), is built with nvcc and gives the
original's checksum; then the campaign searches its block (the recorded shape is not kept),
`r3 apply` ships its winner and the patched program still gives that checksum.  About a minute.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.gpu.app_build import require_app_tools
from tests.gpu.test_gpu_app_search import r3

pytestmark = pytest.mark.gpu

APP = Path(__file__).resolve().parent / "apps" / "rows_app"
ARGS = ("1024", "8")


def _run(app: Path) -> str:
    ran = subprocess.run(["./rows_app", *ARGS], cwd=app, capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    found = re.search(r"checksum: (\S+)", ran.stdout)
    assert found is not None, ran.stdout
    return found.group(1)


def _build(app: Path) -> None:
    built = subprocess.run(["make"], cwd=app, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr


def test_a_block_built_in_a_variable_is_searched_shipped_and_the_app_agrees(
        tmp_path: Path) -> None:
    require_app_tools()
    from r3tui.engine.splice import scale_launch_grids, splice_definition
    from r3tui.remix.rules import apply_rule

    app = tmp_path / "app"
    shutil.copytree(APP, app)
    _build(app)
    expected = _run(app)

    # the launch r3 apply writes for blocks of 32x8, with the axes exchanged in the kernel
    source = (APP / "rows_app.cu").read_text()
    swapped = apply_rule("swap_xy", source, "eliminate", random.Random(0))
    assert swapped.ok and swapped.source is not None, swapped.reason
    spliced = splice_definition(source, swapped.source, "eliminate")
    assert spliced is not None and spliced != source
    shaped = scale_launch_grids(spliced, "eliminate", (1, 1, 1), (1, 1, 1), (), block=(32, 8, 1))
    assert shaped is not None and shaped[1] == 1
    by_hand = tmp_path / "by_hand"
    shutil.copytree(APP, by_hand)
    (by_hand / "rows_app.cu").write_text(shaped[0])
    _build(by_hand)
    assert _run(by_hand) == expected

    db, rec = tmp_path / "r3.sqlite", tmp_path / "rec"
    recorded = r3("record", "--out", str(rec), "--source", str(app), "--db", str(db), "--",
                  "./rows_app", *ARGS, cwd=app)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    tuned = r3("tune-app", str(rec), "--top", "1", "--budget", "10", "--rules-only",
               "--inner-budget", "4", "--seed-budget", "8", "--batch", "4", "--db", str(db),
               cwd=tmp_path)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    assert "block 4x4x1 kept" not in tuned.stdout, tuned.stdout  # the block is searched
    plan = json.loads((rec / "tune-app.json").read_text())
    (campaign,) = [k["campaign_id"] for k in plan["kernels"] if k["campaign_id"] is not None]
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
        blocks = {tuple(json.loads(c)["block"] or (4, 4, 1)) for (c,) in con.execute(
            "select config from trials where campaign_id = ?", (campaign,))}
    assert len(blocks - {(4, 4, 1)}) >= 2, blocks

    out = tmp_path / "patched"
    applied = r3("apply", str(campaign), "--into", str(out), "--source-tree", str(app),
                 "--runs", "3", "--max-runs", "6", "--include-noise", "--db", str(db),
                 cwd=tmp_path)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    summary = json.loads((out / "r3-apply.json").read_text())
    (result,) = summary["campaigns"]
    assert not any(n.startswith("nothing") for n in result["not_applied"]), result
    if any(a.startswith("block ") for a in result["applied"]):
        assert "r3_shaped_grid(" in (out / "rows_app.cu").read_text()
    if (out / "rows_app").exists():
        assert _run(out) == expected
