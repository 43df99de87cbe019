"""Re-make the demo that ships with R³ (issue #20): a small recording beside a demo database
whose campaigns show improvements at every level, an LLM campaign with applied and verified
variants, and a non-empty export.  Three steps on two machines, the folder carried between:

    # 1. on the GPU machine (carry .device; the folder comes back under $OUT/demo)
    source .device/setup.sh && python bench/make_demo.py record --out "$OUT/demo"
    # 2. here, with a local model (the GPU machine has no model file): the bundled SmolLM2,
    #    or Qwen2.5-Coder-1.5B (bash bench/fetch_qwen.sh), whose recorded answers a re-run
    #    replays without it (on nbody SmolLM2's 12 proposals compiled 0, session 30)
    python bench/make_demo.py generate --folder examples/demo \\
        --model bench/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --variants 16
    # 3. on the GPU machine again (carry .device and examples/demo)
    source .device/setup.sh && python bench/make_demo.py evaluate --folder examples/demo \\
        --out "$OUT/demo"

Step 1 records an example (nbody by default: compute-bound, so compiler options, the launch
and the source each have something to gain, and its recording at the default scale is a
quarter of a MB) into ``FOLDER/bundles/``; the recording is stored relative to the database
(docs/database.md), so the folder ships as a whole and ``r3 demo`` on a CPU machine opens a
copy of it.  Step 2 writes the model's proposals as pending variants (``r3 tune
--generate-only``).  Step 3 runs a rules-and-search campaign with the code of the day (its
final re-timing measures what the source, the options and the launch each gained), evaluates
the pending proposals (``r3 evaluate``) and prints what ``r3 runs`` says: every GPU figure
of the demo comes from one GPU machine and one code version, whatever time passed for step 2.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "nbody"
# of the example's full size: nbody at 0.05 has 7,327 bodies (a 230 KB recording) and a
# kernel of about a millisecond; another example gets 0.01
SCALES = {"nbody": 0.05}
DB_NAME = "r3-demo.sqlite"


def r3(*args: str) -> None:
    command = [sys.executable, "-m", "r3tui", *args]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def bundle_of(folder: Path) -> Path:
    """The one recording under ``folder/bundles``."""
    found = sorted((folder / "bundles").glob("*.r3b"))
    if len(found) != 1:
        raise SystemExit(f"make_demo: error: expected one recording under {folder / 'bundles'}, "
                         f"found {len(found)}")
    return found[0]


def record(out: Path, example: str, scale: float | None) -> None:
    if out.exists():
        shutil.rmtree(out)
    bundle = out / "bundles" / f"{example}.r3b"
    bundle.parent.mkdir(parents=True)
    db = out / DB_NAME
    ex = ROOT / "examples" / example
    scale = scale if scale is not None else SCALES.get(example, 0.01)
    r3("record", "kernel", str(ex / "kernel.cu"), "--kernel", example, "--inputs",
       str(ex / "inputs.py"), "--scale", str(scale), "--out", str(bundle), "--db", str(db))


def generate(folder: Path, variants: int, model: Path | None) -> None:
    bundle = bundle_of(folder)
    chosen = ("--model", str(model)) if model is not None else ()
    r3("tune", str(bundle), "--generate-only", "--budget", str(variants), "--llm-share", "1",
       "--name", f"{bundle.stem}-llm", "--db", str(folder / DB_NAME), *chosen)


def evaluate(folder: Path, out: Path | None, budget: str) -> None:
    db = folder / DB_NAME
    bundle = bundle_of(folder)
    r3("tune", str(bundle), "--rules-only", "--budget", budget, "--name", f"{bundle.stem}-rules",
       "--db", str(db))
    r3("evaluate", "--db", str(db), "--bundle", str(bundle))
    r3("runs", "--db", str(db))
    if out is not None:
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*-wal", "*-shm"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="step", required=True)
    rec = sub.add_parser("record", help="on the GPU: the recording")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--example", default=EXAMPLE, help=f"example to record ({EXAMPLE})")
    rec.add_argument("--scale", type=float,
                     help="of the example's full size (nbody 0.05, another example 0.01)")
    gen = sub.add_parser("generate", help="here: the model's proposals, pending")
    gen.add_argument("--folder", type=Path, required=True)
    gen.add_argument("--variants", type=int, default=8)
    gen.add_argument("--model", type=Path,
                     help="a GGUF file (default: the bundled SmolLM2; bench/fetch_qwen.sh "
                     "gives Qwen2.5-Coder-1.5B, whose answers the demo's re-run replays "
                     "without it)")
    ev = sub.add_parser("evaluate", help="on the GPU: a rules campaign, and the pending "
                        "proposals evaluated")
    ev.add_argument("--folder", type=Path, required=True)
    ev.add_argument("--budget", default="20", help="variants of the rules campaign (20)")
    ev.add_argument("--out", type=Path, help="copy the folder here afterwards (e.g. $OUT/demo)")
    args = parser.parse_args(argv)
    if args.step == "record":
        record(args.out, args.example, args.scale)
    elif args.step == "generate":
        generate(args.folder, args.variants, args.model)
    else:
        evaluate(args.folder, args.out, args.budget)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
