"""The PyCUDA capture recorder records an unchanged PyCUDA program and its bundles replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from r3tui.domain import MeasurementStatus

pytestmark = pytest.mark.gpu

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def test_capture_records_an_unchanged_pycuda_program(tmp_path: Path) -> None:
    pytest.importorskip("pycuda")
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.record.bundle import Bundle
    from r3tui.replay import Candidate, ReplayWorker

    out, db = tmp_path / "captured", tmp_path / "r3.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run(
        [sys.executable, "-m", "r3tui", "record", "pycuda", "--out", str(out), "--db", str(db),
         str(HERE / "pycuda_program.py")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "pycuda program ok" in proc.stdout

    assert proc.stdout.count("recorded scale_add") == 2

    from db import repository as repo
    from db.session import open_database

    database = open_database(db, readonly=True, create=False, upgrade=False)
    with database.session_scope() as session:
        assert [r.kernel_name for r in repo.list_recordings(session)] == ["scale_add"] * 2
    database.close()

    index = json.loads((out / "index.json").read_text())
    by_block = {tuple(e["block"]): e for e in index["bundles"]}
    assert set(by_block) == {(256, 1, 1), (128, 1, 1)}, index
    assert by_block[(256, 1, 1)]["count"] == 6 and by_block[(128, 1, 1)]["count"] == 1
    assert by_block[(256, 1, 1)]["total_time_s"] > 0

    for entry in index["bundles"]:
        bundle = Bundle.open(out / entry["path"], verify=True)
        m = bundle.manifest
        assert [p.kind.value for p in m.params] == ["pointer"] * 3 + ["bytes"] * 2
        assert [g.name for g in m.globals] == ["calls"]
        source = bundle.source()
        assert source is not None and "scale_add" in source
        with ReplayWorker(bundle.path) as worker:
            info = worker.start()
            original = worker.evaluate(Candidate(bundle.binary() or b"", m.kernel.entry_point))
            assert original.status is MeasurementStatus.OK, original.error_text
            compiled = get_toolchain("nvrtc").compile(CompileRequest(
                source=source, kernel_name=m.kernel.name, arch=info.arch))
            assert compiled.ok, compiled.log
            again = worker.evaluate(Candidate.from_compiled(compiled))
            assert again.status is MeasurementStatus.OK, again.error_text
