"""A cooperative launch (cudaLaunchCooperativeKernel, a kernel that synchronizes its grid)
is recorded as one and replays as one, to its epilogue (tests/gpu/apps/coop_app.cu)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r3tui.cli import main
from tests.gpu.app_build import build_app, replays_exactly

pytestmark = pytest.mark.gpu

APP = Path(__file__).resolve().parent / "apps" / "coop_app.cu"


def test_a_cooperative_launch_is_recorded_and_replayed_cooperatively(tmp_path: Path) -> None:
    from r3tui.record.bundle import Bundle

    exe = build_app(APP, tmp_path / "coop_app", "static")
    out = tmp_path / "rec"
    code = main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", str(out),
                 "--source", str(APP), "--", str(exe), "100000"])
    assert code == 0
    data = json.loads((out / "recording.json").read_text())
    (kernel,) = [k for k in data["kernels"] if "two_phase_sum" in k["entry_point"]]
    assert kernel["launches"] == 3
    (config,) = kernel["configs"]
    assert config["replayable"], config["reasons"]
    bundle = Bundle.open(out / config["bundle"])
    assert bundle.manifest.launch.cooperative is True
    ok, why = replays_exactly(out / config["bundle"])
    assert ok, why
