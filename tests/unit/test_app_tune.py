"""`r3 tune-app` ranking and prediction on a synthetic recording.json, and `r3 apply` writing
tuned campaigns (a real SQLite database built with the repository) into a copy of the example
application's tree."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from db import repository as repo
from db.session import open_database
from r3tui.domain import (
    Campaign,
    CampaignStatus,
    Dim3,
    KernelLaunch,
    LaunchTimes,
    Recording,
    TrialConfig,
    Variant,
    VariantOrigin,
    VariantStatus,
)
from r3tui.engine.application import amdahl, load_recording, render_ranking, select, tune_app
from r3tui.errors import R3Error
from tests.db.factories import ok, sha

REPO = Path(__file__).resolve().parents[2]
CG = REPO / "examples" / "apps" / "cg"
SPMV = "_ZN2cg8spmv_csrENS_9CsrMatrixEPKdPd"
DOT = "_ZN2cg11dot_partialILi256EEEvPKdS2_Pdi"
UPDATE = "_ZN2cg9update_xrEPKNS_9CgVectorsEdi"
XPAY = "_ZN2cg6detail4xpayIdEEvPKT_S2_PS2_i"


def r3(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_")}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": str(REPO)})
    env["XDG_CONFIG_HOME"] = str(cwd / ".config")
    return subprocess.run(
        [sys.executable, "-m", "r3tui", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _kernel(entry: str, name: str, configs: list[tuple[float, int, str | None, bool]]) -> dict:
    return {
        "entry_point": entry,
        "name": name,
        "launches": sum(c[1] for c in configs),
        "device_time_s": sum(c[0] for c in configs),
        "source": {"path": str(CG / "cg.cu"), "kernel": name},
        "configs": [
            {
                "grid": [64, 1, 1],
                "block": [128, 1, 1],
                "shared_mem_bytes": 0,
                "count": count,
                "device_time_s": t,
                "bundle": bundle,
                "replayable": replayable,
                "reasons": [] if replayable else ["touches managed memory at 0x7f0000000000"],
            }
            for t, count, bundle, replayable in configs
        ],
    }


def write_recording(directory: Path, cwd: Path) -> Path:
    """A recording.json as `r3 record --` writes it: 1.0 s of kernel time in all."""
    directory.mkdir(parents=True, exist_ok=True)
    data = {
        "format_version": 1,
        "command": ["./cg", "--n", "32"],
        "cwd": str(cwd),
        "runtime": "static",
        "recorded_at": "2026-12-02T14:00:00+00:00",
        "wall_s": 2.5,
        "exit_code": 0,
        "reachable": False,
        "kernels": [
            _kernel(XPAY, "cg::detail::xpay<double>", [(0.05, 100, "bundles/xpay-0", True)]),
            # two configurations; the bigger one is tuned
            _kernel(
                SPMV,
                "cg::spmv_csr",
                [(0.10, 1, "bundles/spmv-1", True), (0.50, 100, "bundles/spmv-0", True)],
            ),
            _kernel(UPDATE, "cg::update_xr", [(0.10, 100, "bundles/update-0", True)]),
            _kernel(DOT, "cg::dot_partial<256>", [(0.25, 200, None, False)]),
        ],
        "unsupported_allocations": [],
        "warnings": [],
    }
    (directory / "recording.json").write_text(json.dumps(data))
    return directory


def test_kernels_ranked_by_device_time_share(tmp_path: Path) -> None:
    recording = load_recording(write_recording(tmp_path / "rec", CG))
    assert [k.name for k in recording.kernels] == [
        "cg::spmv_csr",
        "cg::dot_partial<256>",
        "cg::update_xr",
        "cg::detail::xpay<double>",
    ]
    assert [round(k.share, 6) for k in recording.kernels] == [0.6, 0.25, 0.1, 0.05]
    spmv = recording.kernels[0]
    assert spmv.target is not None and spmv.target.bundle == tmp_path / "rec/bundles/spmv-0"
    assert spmv.target.share == pytest.approx(0.5)
    chosen = select(recording, 3)
    assert [why for _, why in chosen] == [
        None,
        "skipped: touches managed memory at 0x7f0000000000",
        None,
    ]


def test_graph_time_counts_in_the_shares(tmp_path: Path) -> None:
    rec = write_recording(tmp_path / "rec", CG)
    data = json.loads((rec / "recording.json").read_text())
    data["graphs"] = {"launches": 10, "device_time_s": 1.0, "kernels": ["cg::step"]}
    (rec / "recording.json").write_text(json.dumps(data))
    recording = load_recording(rec)
    # 1.0 s recorded + 1.0 s in graphs: every recorded share halves
    assert recording.kernel_time_s == pytest.approx(2.0)
    assert [round(k.share, 6) for k in recording.kernels] == [0.3, 0.125, 0.05, 0.025]
    assert "1000.000 ms of it in CUDA graphs" in render_ranking(recording, 2)[0]


def test_amdahl_over_kernel_time_shares() -> None:
    assert amdahl([]) == 1.0
    assert amdahl([(0.5, 2.0)]) == pytest.approx(1 / (0.5 + 0.25))
    # 1 / (1 - 0.6 + 0.5/1.25 + 0.1/2)
    assert amdahl([(0.5, 1.25), (0.1, 2.0)]) == pytest.approx(1 / 0.85)
    with pytest.raises(ValueError):
        amdahl([(0.7, 2.0), (0.6, 2.0)])


def test_tune_app_tunes_the_top_kernels_and_records_their_campaigns(tmp_path: Path) -> None:
    directory = write_recording(tmp_path / "rec", CG)
    recording = load_recording(directory)
    calls: list[tuple[Path, str]] = []

    def fake_tuner(bundle: Path, name: str) -> tuple[int, float | None, tuple[float, float] | None]:
        """Stands in for the GPU campaign (which cannot run here): fixed speedups."""
        calls.append((bundle, name))
        return (len(calls), {"cg::spmv_csr": 1.25, "cg::update_xr": 2.0}[name], (1.1, 1.3))

    result = tune_app(recording, tmp_path / "r3.sqlite", "10", 3, fake_tuner)
    assert [name for _, name in calls] == ["cg::spmv_csr", "cg::update_xr"]
    # spmv's winner ships to both its configurations (0.5 tuned + 0.1): its 0.6 of kernel time
    assert result.kernel_time_speedup == pytest.approx(1 / (1 - 0.7 + 0.6 / 1.25 + 0.1 / 2.0))
    assert [(k.share, k.config_share) for k in result.kernels if k.campaign_id] == [
        (pytest.approx(0.6), pytest.approx(0.5)), (pytest.approx(0.1), pytest.approx(0.1))]
    # kernels were 1.0 s of the recorded 2.5 s: every share counts 0.4 of itself on the wall
    wall = 1 / (1 - 0.4 * 0.7 + 0.4 * 0.6 / 1.25 + 0.4 * 0.1 / 2.0)
    assert result.app_wall_speedup == pytest.approx(wall)
    plan = json.loads((directory / "tune-app.json").read_text())
    assert [k["campaign_id"] for k in plan["kernels"]] == [1, None, 2]
    assert plan["kernels"][1]["status"].startswith("skipped: touches managed memory")
    assert plan["predicted_kernel_speedup"] == pytest.approx(result.kernel_time_speedup)
    assert plan["predicted_wall_speedup"] == pytest.approx(wall)
    assert plan["kernel_fraction_of_wall"] == pytest.approx(0.4)
    assert "predicted_app_speedup" not in plan
    assert "kernel device time" in plan["share_basis"]
    assert "recording overhead" in plan["wall_basis"]
    # a winner whose interval reaches 1 is not shipped by r3 apply: counted as unchanged
    noisy = tune_app(recording, tmp_path / "r3.sqlite", "10", 3,
                     lambda bundle, name: (1, 1.25 if "spmv" in name else 2.0,
                                           (1.1, 1.3) if "spmv" in name else (0.99, 3.0)))
    assert [k.significant for k in noisy.kernels] == [True, False, False]
    assert noisy.kernel_time_speedup == pytest.approx(1 / (1 - 0.6 + 0.6 / 1.25))


def test_tune_app_plan_and_bad_input_from_the_command_line(tmp_path: Path) -> None:
    directory = write_recording(tmp_path / "rec", CG)
    plan = r3("tune-app", str(directory), "--top", "2", "--plan", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    assert lines[0].startswith("4 kernels, 1000.000 ms of device time")
    assert "60.00%" in lines[1] and "cg::spmv_csr" in lines[1] and "[tune]" in lines[1]
    assert "[skipped: touches managed memory" in lines[2]
    assert lines[3].endswith("[-]")
    for bad in (
        ("tune-app", str(tmp_path / "missing")),
        ("tune-app", str(directory), "--budget", "lots"),
        ("tune-app", str(directory), "--check-configs", "-1"),
        ("apply", "--into", str(tmp_path / "x")),
    ):
        result = r3(*bad, "--db", str(tmp_path / "r3.sqlite"), cwd=tmp_path)
        assert result.returncode == 2, (bad, result.stderr)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("r3: error:"), bad
    (directory / "recording.json").write_text('{"format_version": 1, "kernels": [{}]}')
    broken = r3("tune-app", str(directory), "--plan", cwd=tmp_path)
    assert broken.returncode == 2 and "field 'entry_point' is missing" in broken.stderr


# -- r3 apply ------------------------------------------------------------------------------
XPAY_BODY = "if (i < n) y[i] = x[i] + beta * y[i];"
XPAY_TUNED = "if (i < n) y[i] = fma(beta, y[i], x[i]);"


def _campaign(
    s,
    kernel: str,
    bundle: Path,
    original: str,
    best_source: str | None,
    best: TrialConfig,
    speedup: float,
    ci: tuple[float, float] = (1.1, 1.5),
    lucky: TrialConfig | None = None,
) -> int:
    """A finished inner-only campaign whose re-timed winner is ``best`` (on ``best_source``
    when given) at ``speedup`` with interval ``ci``; ``lucky``: a config whose single trial
    was faster than the winner's, which the re-timing did not confirm."""
    launch = KernelLaunch(kernel, Dim3(64, 1, 1), Dim3(128, 1, 1), 0, 100, 1e-3)
    rid = repo.add_recording(
        s, Recording(str(bundle), sha(str(bundle)), kernel, launch), {"kernel": kernel}
    )
    cid = repo.create_campaign(
        s, Campaign(f"app:{kernel}", rid, 0, {"mode": "inner-only"}, CampaignStatus.FINISHED)
    )
    seed = repo.add_variant(s, Variant(cid, original, VariantOrigin.SEED))
    recorded = TrialConfig(toolchain="nvcc")
    rows = [repo.NewTrial(cid, seed, recorded, ok(100e-6))]
    winner_variant = seed
    if best_source is None:
        rows.append(repo.NewTrial(cid, seed, best, ok(100e-6 / speedup)))
        if lucky is not None:
            rows.append(repo.NewTrial(cid, seed, lucky, ok(100e-6 / (speedup * 1.2))))
    else:
        child = repo.add_variant(
            s,
            Variant(
                cid,
                best_source,
                VariantOrigin.LLM,
                parent_id=seed,
                status=VariantStatus.IMPROVED,
                operator="fma",
            ),
        )
        rows.append(repo.NewTrial(cid, child, best, ok(100e-6 / speedup)))
        winner_variant = child
    repo.insert_trials(s, rows)
    repo.add_event(
        s,
        cid,
        "inner_done",
        "done",
        {"variant_id": winner_variant, "winner": best.to_json(), "speedup": speedup,
         "ci": list(ci)},
    )
    return cid


def _apply_db(tmp_path: Path, tree: Path, rec: Path) -> tuple[Path, list[int]]:
    original = (tree / "cg.cu").read_text()
    assert XPAY_BODY in original
    db_path = tmp_path / "r3.sqlite"
    with (
        open_database(db_path, create=True, upgrade=True) as database,
        database.session_scope() as s,
    ):
        spmv = _campaign(
            s,
            "cg::spmv_csr",
            rec / "bundles/spmv-0",
            original,
            None,
            TrialConfig(
                toolchain="nvcc",
                options=("--ptxas-options=-dlcm=cg",),
                block=Dim3(256, 1, 1),
                launch_bounds=(256, 2),
            ),
            1.25,
        )
        xpay = _campaign(
            s,
            "cg::detail::xpay<double>",
            rec / "bundles/xpay-0",
            original,
            original.replace(XPAY_BODY, XPAY_TUNED),
            TrialConfig(toolchain="nvcc", options=("--maxrregcount=32",)),
            1.5,
        )
        # a register cap that clashes with the one before
        update = _campaign(
            s,
            "cg::update_xr",
            rec / "bundles/update-0",
            original,
            None,
            TrialConfig(toolchain="nvcc", options=("--maxrregcount=64",)),
            2.0,
        )
    return db_path, [spmv, xpay, update]


def test_apply_writes_a_patch_of_the_tuned_campaigns(tmp_path: Path) -> None:
    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    db_path, ids = _apply_db(tmp_path, tree, rec)
    out = tmp_path / "patched"
    run = r3(
        "apply", *map(str, ids), "--into", str(out), "--no-run", "--db", str(db_path), cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    assert "kernel_time_speedup_predicted: " in run.stdout
    assert "app_wall_speedup_predicted: " in run.stdout
    assert "app_speedup_predicted" not in run.stdout

    text = (out / "cg.cu").read_text()
    assert "spmv_csr(CsrMatrix a" in text
    assert "__global__ void __launch_bounds__(256, 2) spmv_csr(" in text.replace("\n", " ")
    assert XPAY_TUNED in text and XPAY_BODY not in text
    assert (out / "r3-flags.txt").read_text().split() == [
        "-DCG_BLOCK_SPMV=256",
        "--ptxas-options=-dlcm=cg",
        "--maxrregcount=32",
    ]
    summary = json.loads((out / "r3-apply.json").read_text())
    by_id = {c["campaign_id"]: c for c in summary["campaigns"]}
    assert by_id[ids[0]]["not_applied"] == [] and by_id[ids[1]]["not_applied"] == []
    problems = " | ".join(by_id[ids[2]]["not_applied"])
    assert f"campaign {ids[1]} already set --maxrregcount=32" in problems
    # only fully applied campaigns count: spmv 0.6 of kernel time (both its configurations)
    # at 1.25x, xpay 0.05 at 1.5x
    expected = amdahl([(0.6, 1.25), (0.05, 1.5)])
    assert summary["predicted_kernel_speedup"] == pytest.approx(expected)
    assert f"kernel_time_speedup_predicted: {expected:.4f}" in run.stdout
    wall = amdahl([(0.4 * 0.6, 1.25), (0.4 * 0.05, 1.5)])  # 1.0 s of kernels in 2.5 s
    assert summary["predicted_wall_speedup"] == pytest.approx(wall)
    assert f"app_wall_speedup_predicted: {wall:.4f}" in run.stdout
    # the options reach every kernel of the one unit, and say so
    assert "flag --maxrregcount=32: affects every kernel of cg.cu" in run.stdout
    assert by_id[ids[1]]["flag_scope"] == ["--maxrregcount=32: affects every kernel of cg.cu"]
    assert by_id[ids[0]]["flag_scope"] == [
        "--ptxas-options=-dlcm=cg: affects every kernel of cg.cu"]  # not the block macro
    assert by_id[ids[0]]["entry_point"] == SPMV and by_id[ids[0]]["shipped"] is None
    assert "unmeasured" in run.stdout
    assert (out / "r3-exports" / f"campaign-{ids[1]}" / "options.txt").is_file()

    # the patch turns the original tree into the patched one
    patch = (out / "r3-apply.patch").read_text()
    assert "+++ b/cg.cu" in patch and "+++ b/r3-flags.txt" in patch
    check = tmp_path / "check"
    shutil.copytree(tree, check)
    applied = subprocess.run(
        ["patch", "-p1", "-i", str(out / "r3-apply.patch")],
        cwd=check,
        capture_output=True,
        text=True,
        check=False,
    )
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert (check / "cg.cu").read_text() == text

    if shutil.which("nvcc"):  # the spliced tree still builds, with the flags file read
        built = subprocess.run(
            ["make"], cwd=out, capture_output=True, text=True, timeout=300, check=False
        )
        assert built.returncode == 0, built.stdout + built.stderr
        assert "-DCG_BLOCK_SPMV=256" in built.stdout and "--maxrregcount=32" in built.stdout


def test_apply_refuses_bad_targets(tmp_path: Path) -> None:
    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    db_path, ids = _apply_db(tmp_path, tree, rec)
    for args in (
        ("999", "--into", str(tmp_path / "o1")),  # no such campaign
        (str(ids[0]), "--into", str(tree)),  # the source tree itself
        (str(ids[0]), "--into", str(tree / "cg.cu")),  # a file (a directory inside it works)
        (str(ids[0]), "--into", str(tmp_path / "o2"), "--source-tree", str(tmp_path / "nope")),
    ):
        result = r3("apply", *args, "--no-run", "--db", str(db_path), cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("r3: error:") and result.stderr.count("\n") == 1, args


def test_load_recording_rejects_other_versions(tmp_path: Path) -> None:
    (tmp_path / "recording.json").write_text('{"format_version": 2}')
    with pytest.raises(R3Error, match="not a format_version 1"):
        load_recording(tmp_path)


def test_in_app_time_is_the_same_args_mean_where_the_recording_has_it(tmp_path: Path) -> None:
    rec = write_recording(tmp_path / "rec", CG)  # written without same_args: older recordings
    data = json.loads((rec / "recording.json").read_text())
    by_name = {k["name"]: k for k in data["kernels"]}
    # dot(r, r) and dot(p, Ap) share a configuration: 100 of its 200 launches are the
    # recorded dot(r, r), quicker than the mean over all of them
    by_name["cg::dot_partial<256>"]["configs"][0]["same_args"] = {
        "count": 100,
        "time_s": 0.1,
        "timed": 100,
    }
    by_name["cg::update_xr"]["configs"][0]["same_args"] = None  # no reference kept
    # alpha changes every iteration: only the recorded launch had its arguments
    by_name["cg::spmv_csr"]["configs"][1]["same_args"] = {"count": 1, "time_s": 0.2, "timed": 1}
    (rec / "recording.json").write_text(json.dumps(data))
    kernels = {k.name: k for k in load_recording(rec).kernels}
    (dot,) = kernels["cg::dot_partial<256>"].configs
    assert dot.same_args == LaunchTimes(100, 0.1, 100)
    assert dot.in_app_time() == (pytest.approx(1e-3), "same args")
    (update,) = kernels["cg::update_xr"].configs
    assert update.same_args is None and update.in_app_time() == (pytest.approx(1e-3), "all")
    spmv = kernels["cg::spmv_csr"].configs[0]
    assert spmv.same_args == LaunchTimes(1, 0.2, 1)
    assert spmv.in_app_time() == (pytest.approx(5e-3), "all")  # not one launch's 0.2 s
    (xpay,) = kernels["cg::detail::xpay<double>"].configs
    assert xpay.same_args is None and xpay.in_app_time() == (pytest.approx(5e-4), "all")

    by_name["cg::dot_partial<256>"]["configs"][0]["same_args"] = {"count": 3}
    (rec / "recording.json").write_text(json.dumps(data))
    with pytest.raises(R3Error, match="malformed kernel entry"):
        load_recording(rec)


def test_apply_ships_the_re_timed_winner_and_keeps_the_original_against_noise(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    original = (tree / "cg.cu").read_text()
    db_path = tmp_path / "r3.sqlite"
    with (
        open_database(db_path, create=True, upgrade=True) as database,
        database.session_scope() as s,
    ):
        # one trial of -dlcm=cg looked 1.5x; re-timed, the winner is -dlcm=ca at 1.25x
        confirmed = _campaign(
            s, "cg::spmv_csr", rec / "bundles/spmv-0", original, None,
            TrialConfig(toolchain="nvcc", options=("--ptxas-options=-dlcm=ca",)), 1.25,
            lucky=TrialConfig(toolchain="nvcc", options=("--ptxas-options=-dlcm=cg",)),
        )
        noise = _campaign(
            s, "cg::detail::xpay<double>", rec / "bundles/xpay-0", original,
            original.replace(XPAY_BODY, XPAY_TUNED),
            TrialConfig(toolchain="nvcc", options=("--maxrregcount=32",)), 1.001, (0.998, 1.002),
        )
    out = tmp_path / "patched"
    run = r3("apply", str(confirmed), str(noise), "--into", str(out), "--no-run",
             "--db", str(db_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert (out / "r3-flags.txt").read_text().split() == ["--ptxas-options=-dlcm=ca"]
    assert XPAY_BODY in (out / "cg.cu").read_text()  # the noisy xpay variant is not shipped
    summary = json.loads((out / "r3-apply.json").read_text())
    by_id = {c["campaign_id"]: c for c in summary["campaigns"]}
    assert "1.001x [0.998, 1.002], is not faster than the original beyond the noise" in (
        by_id[noise]["not_applied"][0])
    assert summary["predicted_kernel_speedup"] == pytest.approx(amdahl([(0.6, 1.25)]))

    forced = tmp_path / "forced"
    run = r3("apply", str(noise), "--into", str(forced), "--no-run", "--include-noise",
             "--db", str(db_path), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert XPAY_TUNED in (forced / "cg.cu").read_text()


def test_the_l2_policy_nearer_the_applications_time_is_chosen() -> None:
    from r3tui.replay.timing import L2Regime, choose_l2

    regime, note = choose_l2(9.6e-6, cold_s=12.0e-6, warm_s=9.9e-6)
    assert regime is L2Regime.WARM
    assert "left warm" in note and "9.60 µs" in note and "12.00 µs" in note
    regime, note = choose_l2(12.1e-6, cold_s=12.0e-6, warm_s=9.9e-6)
    assert regime is L2Regime.COLD and note.startswith("L2 flushed")
    # a tie stays cold (METHOD.md), then warm
    assert choose_l2(3.0, cold_s=4.0, warm_s=2.0)[0] is L2Regime.COLD
    assert choose_l2(3.0, cold_s=5.0, warm_s=2.0, hot_s=4.0)[0] is L2Regime.WARM
    # hotspot3D on the H100 (session 34): 10.16 µs a launch in the application, 18.14 cold,
    # 13.22 warm; a hot replay nearer the application's time is kept
    regime, note = choose_l2(10.16e-6, cold_s=18.14e-6, warm_s=13.22e-6, hot_s=10.9e-6)
    assert regime is L2Regime.HOT and note.startswith("L2 filled with the launch's data")
    assert "a hot one in 10.90 µs" in note
    # the same on the H100 in session 36: hot was slower than warm (14.30 against 13.28); a
    # primed replay (one untimed launch first) nearer the application's 10.41 µs is kept
    regime, note = choose_l2(10.41e-6, cold_s=18.37e-6, warm_s=13.28e-6, hot_s=14.30e-6,
                             primed_s=10.8e-6)
    assert regime is L2Regime.PRIMED and "an untimed launch of the original" in note
    assert note.endswith("a hot one in 14.30 µs, a primed one in 10.80 µs")
    # not offered (a kernel that reads what it writes): the nearest of the other three
    assert choose_l2(10.41e-6, 18.37e-6, 13.28e-6, 14.30e-6, None)[0] is L2Regime.WARM


def test_in_app_reference_is_the_configurations_own_time_per_launch(tmp_path: Path) -> None:
    from r3tui.engine.application import in_app_reference

    directory = write_recording(tmp_path / "rec", CG)
    # spmv's tuned configuration: 0.50 s over 100 launches
    assert in_app_reference(directory / "bundles" / "spmv-0") == pytest.approx(0.005)
    assert in_app_reference(directory / "bundles" / "spmv-1") == pytest.approx(0.10)
    assert in_app_reference(tmp_path / "elsewhere" / "b" / "c") is None  # no recording.json


def test_the_launch_bounds_floor_is_the_largest_block_the_application_launches(
        tmp_path: Path) -> None:
    # rmsnorm in the corpus: a winner with __launch_bounds__(32) for a kernel the application
    # also launches with 1024 threads could not ship; campaigns never search below this
    from r3tui.engine.application import most_threads_launched

    directory = write_recording(tmp_path / "rec", CG)
    data = json.loads((directory / "recording.json").read_text())
    spmv = next(k for k in data["kernels"] if k["name"] == "cg::spmv_csr")
    spmv["configs"][1]["block"] = [32, 8, 1]  # its other configuration: 256 threads
    (directory / "recording.json").write_text(json.dumps(data))
    assert most_threads_launched(directory / "bundles" / "spmv-0") == 256
    assert most_threads_launched(directory / "bundles" / "update-0") == 128
    assert most_threads_launched(tmp_path / "kernel-recording" / "b") == 0
    from r3tui.engine.inner import InnerSettings, with_app_limits

    app = with_app_limits(InnerSettings(), directory / "bundles" / "spmv-0")
    assert (app.launch_bounds_floor, app.grid_fixed) == (256, True)
    assert with_app_limits(InnerSettings(), tmp_path / "kernel-recording" / "b") == \
        InnerSettings()


def test_the_winner_is_checked_on_the_kernels_other_configurations(tmp_path: Path) -> None:
    from r3tui.engine.transfer import ConfigCheck, UnitCheck, kernel_speedup

    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    db_path, ids = _apply_db(tmp_path, tree, rec)  # spmv's winner: 1.25x on spmv-0
    recording = load_recording(rec)
    checked: list[tuple[int, list[str]]] = []
    units: list[tuple[int, list[str]]] = []

    class FakeChecker:
        """Stands in for the GPU re-timing (engine.transfer.GpuChecker, run on the device):
        the winner is no faster on spmv's other configuration; spmv's options make xpay, the
        unit's one other replayable kernel no campaign ships, 1.1x faster."""

        def configs(self, campaign_id: int, configs) -> list[ConfigCheck]:
            checked.append((campaign_id, [c.bundle.name for c in configs]))
            return [ConfigCheck(str(c.bundle.relative_to(rec)), c.grid, c.block, c.share, 1.0,
                                (0.98, 1.02)) for c in configs]

        def unit(self, campaign_id: int, kernels) -> list[UnitCheck]:
            units.append((campaign_id, [k.name for k in kernels]))
            return [UnitCheck(k.name, k.entry_point, "bundles/xpay-0", k.share, ("-x",), 1.1,
                              (1.05, 1.15)) for k in kernels]

        def without_options(self, campaign_id: int, bundle: Path) -> None:
            raise AssertionError("asked only where the options make another kernel fail")

    tuners = {"cg::spmv_csr": (ids[0], 1.25), "cg::update_xr": (ids[2], 2.0)}
    result = tune_app(recording, db_path, "10", 3,
                      lambda bundle, name: (*tuners[name], (1.1, 1.4)), FakeChecker())
    # only spmv has another configuration with a bundle: 0.5 at 1.25x, 0.1 at 1.0x
    assert checked == [(ids[0], ["spmv-1"])]
    spmv = result.kernels[0]
    assert spmv.kernel_speedup == pytest.approx(0.6 / (0.5 / 1.25 + 0.1 / 1.0))
    assert "2 configuration(s) measured, 100% of the kernel's time" in spmv.kernel_basis
    # both shipped kernels' options reach xpay; it counts once (dot has no bundle)
    assert units == [(ids[0], ["cg::detail::xpay<double>"]),
                     (ids[2], ["cg::detail::xpay<double>"])]
    assert result.kernel_time_speedup == pytest.approx(
        amdahl([(0.6, 1.2), (0.1, 2.0), (0.05, 1.1)]))
    assert result.kernels[2].kernel_speedup is None  # one configuration: nothing to check
    plan = json.loads((rec / "tune-app.json").read_text())
    assert plan["kernels"][0]["checks"][0]["bundle"] == "bundles/spmv-1"

    # r3 apply predicts with the checked figure, which the campaign's event carries
    out = tmp_path / "patched"
    run = r3("apply", str(ids[0]), "--into", str(out), "--no-run", "--db", str(db_path),
             cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "r3-apply.json").read_text())
    # spmv's option reaches the flags file, so xpay's measured 1.1x counts too
    assert summary["campaigns"][0]["neighbours"] == [[XPAY, pytest.approx(0.05), 1.1]]
    assert summary["predicted_kernel_speedup"] == pytest.approx(
        amdahl([(0.6, 1.2), (0.05, 1.1)]))

    # a configuration without a bundle counts at the median of the measured ratios
    half = ConfigCheck("bundles/b", (1, 1, 1), (32, 1, 1), 0.2, 2.0, (1.9, 2.1))
    speedup, how = kernel_speedup(1.0, 0.4, 1.0, [half])
    assert speedup == pytest.approx(1.0 / (0.4 / 1.0 + 0.2 / 2.0 + 0.4 / 1.5))
    assert "the other 40% at their median ratio 1.500" in how


def test_a_winner_wrong_on_another_configuration_is_not_shipped(tmp_path: Path) -> None:
    from r3tui.engine.transfer import ConfigCheck, UnitCheck

    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    db_path, ids = _apply_db(tmp_path, tree, rec)
    wrong = "wrong_result: buffer y differs at element 7"

    class FakeChecker:
        """Stands in for the GPU re-timing: the winner fails verification on spmv-1 (or,
        with ``unit_fails``, its options make xpay fail); the winner without its options is
        no faster beyond the noise."""

        def __init__(self, config_fails: bool) -> None:
            self.config_fails = config_fails
            self.bare: list[int] = []

        def configs(self, campaign_id: int, configs) -> list[ConfigCheck]:
            return [ConfigCheck(str(c.bundle.relative_to(rec)), c.grid, c.block, c.share,
                                *((None, None, wrong) if self.config_fails else (1.3, (1.2, 1.4))))
                    for c in configs]

        def unit(self, campaign_id: int, kernels) -> list[UnitCheck]:
            return [UnitCheck(k.name, k.entry_point, "bundles/xpay-0", k.share, ("--ftz=true",),
                              failed=wrong) for k in kernels]

        def without_options(self, campaign_id: int, bundle: Path) -> None:
            self.bare.append(campaign_id)
            return None

    for config_fails, says in ((True, "the winner fails on another configuration"),
                               (False, "its options (--ftz=true) make another kernel")):
        checker = FakeChecker(config_fails)
        result = tune_app(load_recording(rec), db_path, "10", 1,
                          lambda bundle, name: (ids[0], 1.25, (1.1, 1.4)), checker)
        # the winner without its options is tried where they broke another kernel (a winner
        # wrong on another configuration of its own kernel is not checked further)
        assert checker.bare == ([] if config_fails else [ids[0]])
        (spmv,) = result.kernels
        assert not spmv.significant and spmv.status.startswith(f"not shippable: {says}")
        assert wrong in spmv.unsafe and result.kernel_time_speedup == 1.0
        out = tmp_path / f"patched-{config_fails}"
        run = r3("apply", str(ids[0]), "--into", str(out), "--no-run", "--db", str(db_path),
                 cwd=tmp_path)
        assert run.returncode == 0, run.stderr
        (campaign,) = json.loads((out / "r3-apply.json").read_text())["campaigns"]
        assert campaign["applied"] == [] and says in campaign["not_applied"][0]
        assert (out / "cg.cu").read_text() == (tree / "cg.cu").read_text()


def test_tune_app_says_what_the_winner_did_on_each_configuration_and_kernel() -> None:
    from r3tui.engine.application import KernelOutcome, outcome_lines

    k = KernelOutcome(
        "e", "cg::spmv_csr", 0.6, "bundles/spmv-0", 7, 1.25, (1.1, 1.4), "tuned", 0.5,
        kernel_speedup=1.2, kernel_basis="2 configuration(s) measured, 100% of the kernel's time",
        checks=({"grid": [8, 1, 1], "block": [128, 1, 1], "share": 0.1, "speedup": 1.0,
                 "ci": [0.98, 1.02]},),
        neighbours=({"kernel": "cg::xpay", "share": 0.05, "speedup": 1.1},
                    {"kernel": "cg::dot", "share": 0.2, "skipped": "no bundle"}))
    lines = outcome_lines(k)
    assert lines[0] == ("cg::spmv_csr: campaign 7, speedup 1.250x [1.100, 1.400] on the tuned "
                        "configuration (50.00% of kernel time; the kernel holds 60.00%)")
    assert "  on grid 8x1x1, block 128x1x1 (10.00%): 1.000x [0.980, 1.020]" in lines
    assert "  its options on cg::xpay (5.00%): 1.100x" in lines
    assert "  its options on cg::dot (20.00%): not measured: no bundle" in lines
    assert lines[-1] == ("  over the whole kernel: 1.200x (2 configuration(s) measured, 100% of "
                         "the kernel's time)")
    from dataclasses import replace

    unsafe = outcome_lines(replace(k, unsafe="the winner fails on another configuration"))
    assert unsafe[-1] == "  not shipped: the winner fails on another configuration"
    assert "not beyond the noise" not in unsafe[0]


def test_the_units_other_kernels_checked_are_the_largest_replayable_ones(tmp_path: Path) -> None:
    from r3tui.engine.transfer import neighbours

    kernels = load_recording(write_recording(tmp_path / "rec", CG)).kernels
    spmv = kernels[0]
    # dot_partial has no bundle; update_xr (0.1) before xpay (0.05)
    assert [k.name for k in neighbours(kernels, spmv, ())] == [
        "cg::update_xr", "cg::detail::xpay<double>"]
    assert [k.name for k in neighbours(kernels, spmv, (), 1)] == ["cg::update_xr"]
    assert [k.name for k in neighbours(kernels, spmv, {UPDATE})] == ["cg::detail::xpay<double>"]
    assert neighbours(kernels, spmv, (), 0) == []


def test_apply_does_not_ship_a_winner_that_needs_its_own_shared_memory(tmp_path: Path) -> None:
    """A winner launched with dynamic shared memory of its own (a tiled variant's
    `// r3: shared` size) cannot ship: the application's host code sets the launch's bytes.
    `r3 apply` says so and leaves the tree as it was."""
    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    original = (tree / "cg.cu").read_text()
    db_path = tmp_path / "r3.sqlite"
    with (
        open_database(db_path, create=True, upgrade=True) as database,
        database.session_scope() as s,
    ):
        cid = _campaign(s, "cg::detail::xpay<double>", rec / "bundles/xpay-0", original,
                        original.replace(XPAY_BODY, XPAY_TUNED),
                        TrialConfig(toolchain="nvcc", shared_mem_bytes=4096), 1.5)
    out = tmp_path / "patched"
    run = r3("apply", str(cid), "--into", str(out), "--no-run", "--db", str(db_path),
             cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    (campaign,) = json.loads((out / "r3-apply.json").read_text())["campaigns"]
    assert campaign["applied"] == []
    assert "4096 bytes of dynamic shared memory" in campaign["not_applied"][0]
    assert (out / "cg.cu").read_text() == original


def test_a_winner_whose_options_break_another_kernel_ships_without_them(tmp_path: Path) -> None:
    """Rodinia gaussian on the H100 (session 44): Fan2's winner, 9.3x from its block shape,
    carried --prec-div=false, which changed Fan1's results by one ulp, so nothing shipped.
    Where the winner without its options is still faster beyond the noise, that is the
    campaign's verdict (a ``final`` event) and what r3 apply ships, its checks redone."""
    from r3tui.engine.transfer import (
        ConfigCheck,
        UnitCheck,
        decision_of,
        store_without_options,
    )

    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    db_path, ids = _apply_db(tmp_path, tree, rec)
    wrong = "wrong_result: buffer y differs at element 7"
    asked: list[tuple[str, tuple[str, ...]]] = []

    class FakeChecker:
        """Stands in for the GPU re-timing: spmv's options make xpay fail; without them the
        winner is 1.2x [1.15, 1.25] and still right on spmv's other configuration."""

        def configs(self, campaign_id: int, configs) -> list[ConfigCheck]:
            found = decision_of(db_path, campaign_id)
            assert found is not None
            asked.append(("configs", tuple(found[2].options)))
            return [ConfigCheck(str(c.bundle.relative_to(rec)), c.grid, c.block, c.share,
                                1.2, (1.1, 1.3)) for c in configs]

        def unit(self, campaign_id: int, kernels) -> list[UnitCheck]:
            return [UnitCheck(k.name, k.entry_point, "bundles/xpay-0", k.share,
                              ("--ptxas-options=-dlcm=cg",), failed=wrong) for k in kernels]

        def without_options(self, campaign_id: int, bundle: Path
                            ) -> tuple[float, tuple[float, float]]:
            found = decision_of(db_path, campaign_id)
            assert found is not None and bundle.name == "spmv-0"
            variant_id, _, config = found
            bare = dataclasses.replace(config, options=())
            store_without_options(db_path, campaign_id, variant_id, bare, config.options, 1.2,
                                  (1.15, 1.25))
            return 1.2, (1.15, 1.25)

    result = tune_app(load_recording(rec), db_path, "10", 1,
                      lambda bundle, name: (ids[0], 1.25, (1.1, 1.4)), FakeChecker())
    (spmv,) = result.kernels
    assert spmv.significant and spmv.unsafe is None and spmv.speedup == 1.2
    assert spmv.status.startswith("tuned without its options: its options "
                                  "(--ptxas-options=-dlcm=cg) make another kernel")
    # the kernel's other configuration checked again, with the verdict that now ships
    assert asked == [("configs", ("--ptxas-options=-dlcm=cg",)), ("configs", ())]
    assert spmv.checks and spmv.checks[0]["speedup"] == 1.2
    out = tmp_path / "patched"
    run = r3("apply", str(ids[0]), "--into", str(out), "--no-run", "--db", str(db_path),
             cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    (campaign,) = json.loads((out / "r3-apply.json").read_text())["campaigns"]
    assert campaign["not_applied"] == [], campaign
    assert (out / "r3-flags.txt").read_text().split() == ["-DCG_BLOCK_SPMV=256"]


def _spmv_varies(rec: Path) -> None:
    """spmv's tuned configuration (100 launches, 0.5 s) with its arguments changing every
    launch, and the first (replayed) launch four times the others' mean: a step of an
    elimination whose later launches have less left to do (gaussian's Fan2)."""
    data = json.loads((rec / "recording.json").read_text())
    spmv = next(k for k in data["kernels"] if k["name"] == "cg::spmv_csr")
    spmv["configs"][1]["same_args"] = {"count": 1, "time_s": 0.02, "timed": 1}
    (rec / "recording.json").write_text(json.dumps(data))


def test_a_replayed_launch_doing_other_work_than_the_rest_is_said_to_make_the_prediction_uncertain(
        tmp_path: Path) -> None:
    """gaussian (H100, session 45): its Fan2 ran 4095 launches of one configuration, each
    with another elimination step; tune-app replayed the first (the most work), predicted
    10.2x and r3 apply measured 17.8x [17.7, 17.8]. Launches with other arguments but the
    same time (double-buffered pointers) leave the prediction as it was."""
    from r3tui.engine.application import outcome_lines
    from r3tui.engine.prediction import prediction_lines

    rec = write_recording(tmp_path / "rec", CG)
    _spmv_varies(rec)
    spmv = next(k for k in load_recording(rec).kernels if k.name == "cg::spmv_csr")
    assert spmv.target is not None
    why = spmv.target.other_work("cg::spmv_csr")
    assert why is not None and "recur in 1 of the 100 launches" in why
    assert "took 4848.5 us a launch against its 20000.0 us" in why
    # swapped pointers: the other launches take as long as the replayed one
    same_time = dataclasses.replace(spmv.target, same_args=LaunchTimes(50, 0.26, 50))
    assert same_time.other_work("k") is None
    # every launch had the replayed arguments, or the recording cannot say
    assert dataclasses.replace(spmv.target, same_args=LaunchTimes(100, 0.5, 100)
                               ).other_work("k") is None
    assert dataclasses.replace(spmv.target, same_args=None).other_work("k") is None

    result = tune_app(load_recording(rec), tmp_path / "r3.sqlite", "10", 3,
                      lambda bundle, name: (1, 1.25 if "spmv" in name else 0.99, (1.1, 1.3)))
    (outcome,) = [k for k in result.kernels if k.name == "cg::spmv_csr"]
    assert outcome.other_work == why
    assert f"  {why}" in outcome_lines(outcome)
    assert result.other_work == [
        "cg::spmv_csr's replayed launch does other work than its other launches (above)"]
    lines = prediction_lines(result.kernel_time_speedup, result.app_wall_speedup,
                             result.kernel_time_s, result.wall_s, result.other_work)
    assert lines[2] == f"  uncertain: {result.other_work[0]}"
    plan = json.loads((rec / "tune-app.json").read_text())
    assert plan["kernels"][0]["other_work"] == why


def test_apply_says_its_prediction_is_uncertain_where_a_shipped_kernels_launches_differ(
        tmp_path: Path) -> None:
    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    _spmv_varies(rec)
    db_path, ids = _apply_db(tmp_path, tree, rec)
    out = tmp_path / "patched"
    run = r3("apply", *map(str, ids), "--into", str(out), "--no-run", "--db", str(db_path),
             cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    summary = json.loads((out / "r3-apply.json").read_text())
    (why,) = summary["prediction_other_work"]
    assert why.startswith("cg::spmv_csr: the replayed launch's arguments recur in 1 of the 100")
    assert f"  uncertain: {why}" in run.stdout.splitlines()
    # the same campaigns from a recording whose launches all do the replayed launch's work
    _spmv_varies(rec)
    data = json.loads((rec / "recording.json").read_text())
    for k in data["kernels"]:
        for c in k["configs"]:
            c["same_args"] = {"count": c["count"], "time_s": c["device_time_s"],
                              "timed": c["count"]}
    (rec / "recording.json").write_text(json.dumps(data))
    again = r3("apply", *map(str, ids), "--into", str(tmp_path / "p2"), "--no-run", "--db",
               str(db_path), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "uncertain" not in again.stdout
    assert json.loads((tmp_path / "p2" / "r3-apply.json").read_text()
                      )["prediction_other_work"] == []


def test_a_kernel_speedup_with_much_time_unmeasured_and_unlike_gains_is_said_to_be_uncertain(
        tmp_path: Path) -> None:
    """gaussian (H100, session 48): half of Fan2's time was in strata without a snapshot,
    counted at the median of the measured ones (9.1x-16.4x); the prediction, 11.0x, was 43%
    under the 15.8x r3 apply measured. tune-app and apply say so where it happens."""
    from r3tui.engine.prediction import prediction_lines
    from r3tui.engine.transfer import ConfigCheck, UnitCheck, uncertainty

    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tmp_path / "rec", tree)
    data = json.loads((rec / "recording.json").read_text())
    spmv = next(k for k in data["kernels"] if k["name"] == "cg::spmv_csr")
    # a third configuration of spmv, 0.2 s, that was profiled but not snapshotted
    spmv["configs"].append({**spmv["configs"][0], "bundle": None, "replayable": False,
                            "device_time_s": 0.2})
    spmv["device_time_s"] = sum(c["device_time_s"] for c in spmv["configs"])
    (rec / "recording.json").write_text(json.dumps(data))
    db_path, ids = _apply_db(tmp_path, tree, rec)

    class FakeChecker:
        """Stands in for the GPU re-timing: the winner gains 2.0x on spmv-1 (1.25x on the
        tuned spmv-0); no other kernel of the unit is measured."""

        def __init__(self, gain: float) -> None:
            self.gain = gain

        def configs(self, campaign_id: int, configs) -> list[ConfigCheck]:
            return [ConfigCheck(str(c.bundle.relative_to(rec)), c.grid, c.block, c.share,
                                self.gain, (self.gain * 0.98, self.gain * 1.02))
                    for c in configs]

        def unit(self, campaign_id: int, kernels) -> list[UnitCheck]:
            return []

        def without_options(self, campaign_id: int, bundle: Path) -> None:
            raise AssertionError("no options failed")

    result = tune_app(load_recording(rec), db_path, "10", 1,
                      lambda bundle, name: (ids[0], 1.25, (1.1, 1.4)), FakeChecker(2.0))
    (outcome,) = result.kernels
    assert "the other 25% at their median ratio 1.625" in outcome.kernel_basis
    assert outcome.uncertain is not None and outcome.uncertain.startswith(
        "cg::spmv_csr: 25% of its device time is in configurations not re-timed")
    assert "which gained 1.250x to 2.000x" in outcome.uncertain
    assert result.other_work == [outcome.uncertain]
    lines = prediction_lines(result.kernel_time_speedup, result.app_wall_speedup,
                             result.kernel_time_s, result.wall_s, result.other_work)
    assert f"  uncertain: {outcome.uncertain}" in lines
    assert json.loads((rec / "tune-app.json").read_text())["kernels"][0]["uncertain"] == \
        outcome.uncertain
    # r3 apply reads it from the campaign's event and says it with its own prediction
    out = tmp_path / "patched"
    run = r3("apply", str(ids[0]), "--into", str(out), "--no-run", "--db", str(db_path),
             cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "r3-apply.json").read_text())["prediction_other_work"] == [
        outcome.uncertain]
    assert f"  uncertain: {outcome.uncertain}" in run.stdout.splitlines()

    # alike gains, or little time left out: the median is a fair stand-in
    alike = tune_app(load_recording(rec), db_path, "10", 1,
                     lambda bundle, name: (ids[0], 1.25, (1.1, 1.4)), FakeChecker(1.3))
    assert alike.kernels[0].uncertain is None and alike.other_work == []
    half = ConfigCheck("bundles/b", (1, 1, 1), (32, 1, 1), 0.1, 2.0, (1.9, 2.1))
    assert uncertainty("k", 1.0, 0.85, 1.0, [half]) is None  # 5% unmeasured
    assert uncertainty("k", 1.0, 0.8, 1.0, [half]) is not None  # 10%
