"""`r3 record -- ./app` on a program that captures streams into CUDA graphs.

tests/gpu/apps/graph_app.cu launches kernels normally and through four graphs (captured in
the global, thread-local and relaxed modes, and one built by hand around a child graph).
Recording must leave the captures intact -- the application's results equal those of a plain
run -- record and replay the normal launches exactly, and report the graph launches it did
not record in recording.json and in one line of `r3 record`'s output.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from r3tui.cli import main
from r3tui.domain import MeasurementStatus
from tests.gpu.app_build import LINKAGES, build_app

pytestmark = pytest.mark.gpu

APP = Path(__file__).resolve().parent / "apps" / "graph_app.cu"


@pytest.fixture(scope="module", params=sorted(LINKAGES))
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, dict[str, Any], str, str, str]:
    linkage = request.param
    work = tmp_path_factory.mktemp(f"graphs-{linkage}")
    exe = build_app(APP, work / f"graph_app_{linkage}", linkage)
    plain = subprocess.run([str(exe), str(work / "plain.txt")], capture_output=True, text=True,
                           timeout=120, check=False)
    assert plain.returncode == 0, plain.stderr
    out = work / "rec"
    said = io.StringIO()
    with contextlib.redirect_stderr(said):  # r3's own lines; the application's go to the fd
        code = main(["--db", str(work / "r3.sqlite"), "record", "--out", str(out),
                     "--timeout", "300", "--source", str(APP), "--", str(exe),
                     str(work / "recorded.txt")])
    assert code == 0, said.getvalue()
    data = json.loads((out / "recording.json").read_text())
    return out, data, (work / "plain.txt").read_text(), (work / "recorded.txt").read_text(), \
        said.getvalue()


def _kernel(data: dict[str, Any], name: str) -> dict[str, Any] | None:
    found = [k for k in data["kernels"] if name in k["entry_point"]]
    assert len(found) <= 1, [k["entry_point"] for k in data["kernels"]]
    return found[0] if found else None


def test_recording_leaves_the_captures_and_the_results_intact(
        recorded: tuple[Path, dict[str, Any], str, str, str]) -> None:
    _out, data, plain, under_record, _said = recorded
    assert data["exit_code"] == 0
    assert under_record == plain  # a broken capture would fail the run or change the sums


def test_normal_launches_are_recorded_and_graph_launches_are_not(
        recorded: tuple[Path, dict[str, Any], str, str, str]) -> None:
    _out, data, _plain, _under, _said = recorded
    launches = {name: k["launches"] for name in ("scale", "axpy", "step")
                if (k := _kernel(data, name)) is not None}
    assert launches == {"scale": 1, "axpy": 2, "step": 1}  # outside graphs only
    assert _kernel(data, "mix") is None  # launched only inside graphs
    graphs = data["graphs"]
    assert graphs["launches"] == 10 and graphs["device_time_s"] > 0
    assert graphs["instantiated"] == 4
    assert graphs["kernel_node_launches"] == 24
    assert graphs["captured_kernel_launches"] == 5
    names = " ".join(graphs["kernels"])
    for kernel in ("step", "mix", "scale", "axpy"):
        assert kernel in names, graphs["kernels"]
    assert not [w for w in data["warnings"] if "capturing" in w], data["warnings"]


def test_record_says_in_one_line_that_graph_launches_were_not_recorded(
        recorded: tuple[Path, dict[str, Any], str, str, str]) -> None:
    _out, _data, _plain, _under, said = recorded
    lines = [ln for ln in said.splitlines() if "CUDA graph launches were not recorded" in ln]
    assert len(lines) == 1, said
    assert lines[0].startswith("10 CUDA graph launches were not recorded: 24 kernel runs")


def test_every_recorded_launch_replays_to_its_epilogue_exactly(
        recorded: tuple[Path, dict[str, Any], str, str, str]) -> None:
    from r3tui.record.bundle import Bundle
    from r3tui.replay import Candidate, ReplayWorker

    out, data, _plain, _under, _said = recorded
    bad: dict[str, str] = {}
    replayed = 0
    for kernel in data["kernels"]:
        for config in kernel["configs"]:
            assert config["replayable"], (kernel["entry_point"], config["reasons"])
            bundle = Bundle.open(out / config["bundle"], verify=True)
            binary = bundle.binary()
            assert binary is not None
            with ReplayWorker(bundle.path, timeout_s=120) as worker:
                result = worker.evaluate(Candidate(binary, bundle.manifest.kernel.entry_point),
                                         timed=False)
            replayed += 1
            if not (result.status is MeasurementStatus.OK and result.verified
                    and not result.max_error):
                bad[kernel["entry_point"]] = f"{result.status}: {result.error_text}"
    assert replayed == 3 and not bad, bad
