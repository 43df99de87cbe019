"""A recorded kernel whose unit includes the application's own headers is recompiled from
its bundle alone and replays exactly.

tests/gpu/apps/header_app/heat.cu includes "heat.h" (beside it), which includes
<heat/params.h> through -Iinclude.  The tree is copied, built, recorded with
`--source heat.cu --include include`, and deleted; the bundle's unit is then compiled with
nvcc against the bundle's own copy of the headers and replayed to its epilogue.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from r3tui.cli import main
from r3tui.domain import MeasurementStatus

pytestmark = pytest.mark.gpu

APP = Path(__file__).resolve().parent / "apps" / "header_app"


def test_a_unit_with_application_headers_recompiles_from_its_bundle_and_replays(
        tmp_path: Path) -> None:
    from r3tui.compile import CompileRequest, get_toolchain
    from r3tui.record.bundle import Bundle
    from r3tui.replay import Candidate, ReplayWorker

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    tree = tmp_path / "heat"
    shutil.copytree(APP, tree)
    exe = tmp_path / "heat_app"
    build = subprocess.run([nvcc, "-arch=sm_90", "-Iinclude", "-o", str(exe), "heat.cu"],
                           cwd=tree, capture_output=True, text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stderr
    out = tmp_path / "rec"
    assert main(["--db", str(tmp_path / "r3.sqlite"), "record", "--out", str(out),
                 "--timeout", "300",
                 "--source", str(tree / "heat.cu"), "--include", str(tree / "include"), "--",
                 str(exe), str(tmp_path / "sum.txt")]) == 0
    data = json.loads((out / "recording.json").read_text())
    (kernel,) = data["kernels"]
    assert kernel["source"]["error"] is None and kernel["launches"] == 10
    assert sorted(Path(p).name for p in kernel["source"]["headers"]) == ["heat.h", "params.h"]
    shutil.rmtree(tree)  # the bundle alone must be enough

    bad = {}
    for config in kernel["configs"]:
        bundle = Bundle.open(out / config["bundle"], verify=True)
        k = bundle.manifest.kernel
        assert sorted(h.name for h in k.headers) == ["heat.h", "include/heat/params.h"]
        source = bundle.source()
        assert source is not None
        with ReplayWorker(bundle.path, timeout_s=120) as worker:
            info = worker.start()
            compiled = get_toolchain("nvcc").compile(CompileRequest(
                source=source, kernel_name=k.name, arch=info.arch, options=k.options,
                defines=k.defines, include_dirs=bundle.include_dirs(),
                source_name=k.sources[0].name))
            assert compiled.ok, compiled.log
            assert compiled.lowered_name == k.entry_point
            result = worker.evaluate(Candidate.from_compiled(compiled), timed=False)
        if not (result.status is MeasurementStatus.OK and result.verified
                and not result.max_error):
            bad[tuple(config["grid"])] = f"{result.status}: {result.error_text}"
    assert not bad, bad
