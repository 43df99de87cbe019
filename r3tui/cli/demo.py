"""``r3 demo``: the shortest way to see R³ work.

On a GPU node it records one example kernel into a temporary folder and runs a short live
campaign inside the TUI (the engine as a child process, as any campaign started from the
TUI).  On a machine without a GPU it says so in one line and opens the demo database that
ships with R³, recorded on an H200 by a real campaign, read-only from a temporary copy (a
WAL reader needs to write a -shm file next to the database, and an installed tree may be
read-only).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from r3tui.errors import R3Error

if TYPE_CHECKING:
    from r3tui.cli import Subcommands
    from r3tui.ui.launcher import LaunchRequest

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPO_ROOT / "examples"
DEMO_DB = EXAMPLES_DIR / "demo" / "r3-demo.sqlite"
DEMO_EXAMPLE = "stencil7"
# short on purpose: a demo shows a tree growing within a few minutes
DEMO_TUNE_ARGS = "--inner-budget 8 --seed-budget 16"


class DemoUnavailable(R3Error):
    """What the demo needs is not in this installation."""


def add_commands(subparsers: Subcommands) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="on a GPU: record an example and tune it live in the TUI; else open the demo DB",
    )
    demo.add_argument("--example", default=DEMO_EXAMPLE, help="example kernel to record")
    demo.add_argument("--budget", default="12", help="variants (12) or time (5m) of the campaign")
    demo.add_argument(
        "--tune-args",
        default=DEMO_TUNE_ARGS,
        help=f"`r3 tune` arguments of the live campaign (default {DEMO_TUNE_ARGS!r}; "
        "--rules-only is added where llama_cpp is not installed)",
    )
    demo.add_argument(
        "--no-gpu", action="store_true", help="open the shipped demo database even on a GPU node"
    )
    demo.set_defaults(handler=cmd_demo)


def gpu_available() -> bool:
    """Can the CUDA driver start and see a device?  (Cheap: no context is created.)"""
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
    except Exception:  # cuda-bindings raises when libcuda.so itself is missing
        return False
    return err == driver.CUresult.CUDA_SUCCESS and count > 0


def open_shipped_demo(db: Path = DEMO_DB) -> int:
    from r3tui.cli.tui import run_tui

    if not db.is_file():
        raise DemoUnavailable(
            f"no demo database at {db}",
            hint="it ships in a checkout of R³ under examples/demo/; "
            "or point `r3 tui --db` at a database of your own",
        )
    with tempfile.TemporaryDirectory(prefix="r3-demo-") as folder:
        # the database's folder whole: its recordings are stored relative to it (a few MB),
        # so the copy's campaigns still find their bundles (r3 tune --generate-only,
        # --replay-llm and r3 export work on it)
        copy = Path(folder) / "demo"
        shutil.copytree(db.parent, copy, ignore=shutil.ignore_patterns("*-wal", "*-shm"))
        return run_tui(copy / db.name)


def record_example(example: str, folder: Path, db: Path) -> Path:
    """``r3 record kernel`` for one example, as a child process; returns the bundle."""
    source = EXAMPLES_DIR / example / "kernel.cu"
    inputs = EXAMPLES_DIR / example / "inputs.py"
    if not source.is_file():
        known = sorted(p.parent.name for p in EXAMPLES_DIR.glob("*/kernel.cu"))
        raise DemoUnavailable(
            f"no example {example!r} under {EXAMPLES_DIR}", hint=f"known: {', '.join(known)}"
        )
    bundle = folder / f"{example}.r3b"
    command = [
        sys.executable, "-m", "r3tui", "record", "kernel", str(source),
        "--kernel", _entry_point(example), "--inputs", str(inputs),
        "--out", str(bundle), "--db", str(db),
    ]  # fmt: skip
    print(f"r3 demo: recording {example} on this GPU …", file=sys.stderr)
    result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise R3Error(f"recording {example} failed: {last}")
    return bundle


def _entry_point(example: str) -> str:
    import tomllib

    spec = tomllib.loads((EXAMPLES_DIR / example / "example.toml").read_text())
    return str(spec.get("kernel", example))


def demo_request(
    example: str, bundle: Path, db: Path, budget: str, tune_args: str
) -> LaunchRequest:
    """The live campaign: the bundled model and rule mutations, or rules alone where the
    model's runtime (llama_cpp, the `llm` extra) is not installed."""
    import importlib.util
    import shlex

    from r3tui.ui.launcher import LaunchRequest

    extra = shlex.split(tune_args)
    if importlib.util.find_spec("llama_cpp") is None and "--rules-only" not in extra:
        print("r3 demo: llama_cpp is not installed; rule mutations only", file=sys.stderr)
        extra.append("--rules-only")
    return LaunchRequest(bundle, db, budget, f"{example}-demo", tuple(extra))


def cmd_demo(args: argparse.Namespace) -> int:
    if args.no_gpu or not gpu_available():
        if not args.no_gpu:
            print(
                "r3 demo: no CUDA GPU on this machine; opening the recorded H200 demo "
                f"campaign read-only ({DEMO_DB.name})",
                file=sys.stderr,
            )
        return open_shipped_demo()
    from r3tui.cli.tui import run_tui

    with tempfile.TemporaryDirectory(prefix="r3-demo-") as tmp:
        folder = Path(tmp)
        db = folder / "r3-demo.sqlite"
        bundle = record_example(args.example, folder, db)
        request = demo_request(args.example, bundle, db, args.budget, args.tune_args)
        return run_tui(db, launch=request)
