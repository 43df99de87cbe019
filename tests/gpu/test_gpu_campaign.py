"""`r3 tune` end to end on the GPU: rule remix + inner BO on replay, every step in a real DB;
stop by signal and resume; generational mode with `r3 evaluate`; a wrong variant is caught by
replay verification; a re-run from the record rebuilds the same tree."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def stencil_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from r3tui.record.kernel_recorder import RecordKernelRequest, record_kernel

    ex = REPO / "examples" / "stencil7"
    out = tmp_path_factory.mktemp("stencil") / "stencil7.r3b"
    record_kernel(
        RecordKernelRequest(ex / "kernel.cu", "stencil7", ex / "inputs.py", out, seed=1, scale=0.5)
    )
    return out


def r3(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "r3tui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def variants(db: Path, campaign: int) -> list:
    from db import repository as repo
    from db.session import open_database

    with open_database(db, readonly=True) as database, database.session_scope() as s:
        return repo.campaign_variants(s, campaign)


def test_tune_runs_the_outer_loop_and_reports(stencil_bundle: Path, tmp_path: Path) -> None:
    from r3tui.domain import VariantOrigin, VariantStatus

    db = tmp_path / "r3.sqlite"
    done = r3(
        "tune",
        str(stencil_bundle),
        "--rules-only",
        "--budget",
        "4",
        "--inner-budget",
        "4",
        "--seed-budget",
        "8",
        "--db",
        str(db),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = variants(db, 1)
    assert found[0].origin is VariantOrigin.SEED and found[0].status is VariantStatus.VERIFIED
    children = found[1:]
    assert all(v.status is not VariantStatus.PENDING for v in children)
    assert any(v.status in (VariantStatus.VERIFIED, VariantStatus.IMPROVED) for v in children)
    report = r3("report", "1", "--db", str(db))
    assert report.returncode == 0, report.stderr
    assert "speedup" in report.stdout and f"yield rule: {len(children)} proposed" in report.stdout
    # the 4 proposals: the stored ones, and those counted as declined or duplicates
    skipped = [int(n) for n in re.findall(r"(\d+) (?:declined|duplicate)", report.stdout)]
    assert len(children) + sum(skipped) == 4, report.stdout
    assert "re-timed interleaved with the original" in report.stdout
    # each level's gain measured: the steps from the original to the winner, re-timed
    contributions = next(ln for ln in report.stdout.splitlines()
                         if ln.startswith("contributions: "))
    assert "each step re-timed interleaved with the original" in contributions, contributions
    export = r3("export", "1", "--db", str(db), "--out", str(tmp_path / "x"))
    assert export.returncode == 0 and (tmp_path / "x" / "stencil7.patch").exists()

    rerun = r3("tune", "--replay-llm", "1", "--db", str(db))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    again = variants(db, 2)
    assert [(v.source, v.operator) for v in again] == [(v.source, v.operator) for v in found]


def test_a_stopped_campaign_resumes(stencil_bundle: Path, tmp_path: Path) -> None:
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import CampaignStatus, VariantStatus
    from r3tui.errors import R3Error

    db = tmp_path / "stop.sqlite"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "r3tui",
            "tune",
            str(stencil_bundle),
            "--rules-only",
            "--budget",
            # far more than can finish before the SIGTERM below: rule proposals that fail to
            # apply take milliseconds, and 40 of them once ran out before the first poll
            "4000",
            "--inner-budget",
            "4",
            "--seed-budget",
            "8",
            "--db",
            str(db),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            done = sum(v.status is not VariantStatus.PENDING for v in variants(db, 1))
        except R3Error:  # the engine is still creating the file and its schema
            continue
        if done >= 3:
            break
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=240)
    assert child.returncode == 0, err[-3000:]
    with open_database(db, readonly=True) as database, database.session_scope() as s:
        campaign = repo.get_campaign(s, 1)
        assert campaign is not None and campaign.status is CampaignStatus.STOPPED
    before = len(variants(db, 1))
    assert before < 4001
    resumed = r3("tune", "--resume", "1", "--budget", str(before + 1), "--db", str(db))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = variants(db, 1)
    assert len(after) >= before and all(v.status is not VariantStatus.PENDING for v in after)


def test_generate_then_evaluate_catches_a_wrong_variant(
    stencil_bundle: Path, tmp_path: Path
) -> None:
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import Variant, VariantOrigin, VariantStatus

    db = tmp_path / "gen.sqlite"
    gen = r3(
        "tune",
        str(stencil_bundle),
        "--rules-only",
        "--generate-only",
        "--budget",
        "2",
        "--db",
        str(db),
    )
    assert gen.returncode == 0, gen.stderr[-3000:]
    seed = variants(db, 1)[0]
    wrong = seed.source.replace("c0 * in[idx]", "c0 * in[idx] * 1.5")
    assert wrong != seed.source
    with open_database(db) as database, database.session_scope() as s:
        bad = repo.add_variant(
            s, Variant(1, wrong, VariantOrigin.LLM, parent_id=seed.id, operator="hand-made wrong")
        )
    done = r3("evaluate", "--db", str(db), "--campaign", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    by_id = {v.id: v for v in variants(db, 1)}
    assert by_id[seed.id].status is VariantStatus.VERIFIED
    assert by_id[bad].status is VariantStatus.WRONG_RESULT
    assert all(v.status is not VariantStatus.PENDING for v in by_id.values())
