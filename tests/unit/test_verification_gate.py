"""The CPU half of docs/verification.md: refusals before any compile, and what the replay
needs to defend itself (module variables read from real cubins, check launches resolved)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from db import repository as repo
from r3tui.domain import Dim3, MeasurementStatus, VariantStatus
from r3tui.engine.lineage import classify
from r3tui.engine.proposals import ProposalRequest
from r3tui.record.manifest import CheckLaunch, LaunchInfo
from r3tui.replay.candidate import Candidate
from r3tui.replay.verify import CheckPolicy
from tests.unit.test_bundle import SOURCE as AXPY
from tests.unit.test_bundle import write_bundle
from tests.unit.test_engine_campaign import SOURCE, evaluate_stored, refusing_run
from tests.unit.test_engine_store_proposal import proposal

REPO = Path(__file__).resolve().parents[2]
ADVERSARIAL = REPO / "tests" / "gpu" / "kernels" / "adversarial"

HOST_CODE = SOURCE.text + '\n#include <cstdlib>\nint main() { return system("id"); }\n'
CLOCKED = SOURCE.text.replace(
    "int i = blockIdx.x", "if (clock64() & 1) return;\n    int i = blockIdx.x", 1)


@pytest.mark.parametrize("text,mentions", [(HOST_CODE, "main"), (CLOCKED, "clock64")])
def test_a_proposal_with_host_code_or_clock_reads_is_stored_unsafe_and_never_compiled(
        tmp_path: Path, text: str, mentions: str) -> None:
    with refusing_run(tmp_path) as (database, cid, run):
        request = ProposalRequest(index=1, island=0, parent=run.seed_variant(), profile=None,
                                  inspirations=())
        stored = run.store_proposal(request, proposal(text))
        assert stored.status is VariantStatus.UNSAFE
        assert mentions in (stored.status_reason or "")
        assert stored not in run.pending()
        with database.session_scope() as s:
            events = repo.events(s, cid)
        assert any("→ unsafe" in e.message and mentions in e.message for e in events)


def test_a_pending_unsafe_variant_from_elsewhere_is_refused_at_evaluation(
        tmp_path: Path) -> None:
    report = evaluate_stored(tmp_path, HOST_CODE)  # as an older R³ or another writer stored it
    assert report.status is VariantStatus.UNSAFE and "main" in (report.reason or "")


def test_r3_replay_refuses_an_unsafe_source_before_compiling(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    candidate = tmp_path / "candidate.cu"
    candidate.write_text('#include <cstdlib>\n' + AXPY + 'void f() { system("id"); }\n')
    run = subprocess.run(
        [sys.executable, "-m", "r3tui", "replay", str(bundle.path), "--source", str(candidate),
         "--db", str(tmp_path / "r3.sqlite")],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    # no GPU here: reaching the compile or the worker would end in exit code 2 instead
    assert run.returncode == 1, run.stdout + run.stderr
    assert "unsafe" in run.stdout and "cstdlib" in run.stdout


def test_an_unsafe_outcome_of_every_trial_classifies_the_variant_unsafe() -> None:
    assert classify({MeasurementStatus.UNSAFE.value: 3}, None, 1.0) == (
        VariantStatus.UNSAFE, "unsafe in 3 trial(s)")


@pytest.mark.parametrize("file,names", [
    ("skip_after_first.cu", ["done"]),
    ("every_other.cu", ["launches_seen"]),
    ("static_counter.cu", ["_ZZ10done_flagsvE4done"]),  # a function-scope static, lowered
    ("partial_write.cu", []),
])
def test_module_variables_are_read_from_real_cubins(file: str, names: list[str]) -> None:
    from r3tui.compile.base import CompileRequest, get_toolchain
    from r3tui.compile.cubin import Cubin

    compiled = get_toolchain("nvrtc").compile(CompileRequest(
        source=(ADVERSARIAL / file).read_text(), kernel_name="stencil7", arch="sm_90",
        source_name=file))
    assert compiled.ok and compiled.binary is not None, compiled.log
    found = Cubin.parse(compiled.binary).module_variables()
    assert [n for n, _ in found] == names
    assert all(size >= 1 << 22 for _, size in found)


def test_a_check_launch_follows_the_candidates_block_with_its_own_work_and_arguments() -> None:
    check = CheckLaunch("seed 1", LaunchInfo(Dim3(13), Dim3(8, 8), 0, Dim3(100, 60)), (), ())
    plain = Candidate(b"", "k")
    assert plain.resolve_check(check) == (Dim3(13), Dim3(8, 8), 0, b"")
    wide = Candidate(b"", "k", block=Dim3(32, 4))
    assert wide.resolve_check(check) == (Dim3(4, 15), Dim3(32, 4), 0, b"")
    # what a check launch cannot follow is not checked there
    assert Candidate(b"", "k", arg_bytes=b"\0").resolve_check(check) is None
    no_work = CheckLaunch("seed 1", LaunchInfo(Dim3(13), Dim3(8)), (), ())
    assert Candidate(b"", "k", grid=Dim3(2)).resolve_check(no_work) is None


def test_the_defences_are_on_by_default_and_off_only_when_asked() -> None:
    on, off = CheckPolicy(), CheckPolicy.off()
    assert on.verify_timed and on.reset_module_state and on.check_launches
    assert on.unsettled_verifications > 0
    assert not (off.verify_timed or off.reset_module_state or off.check_launches)
    assert off.unsettled_verifications == 0
