"""Re-make the demo that ships with R³ (issue #20): small recordings beside a demo database
whose campaigns show improvements at every level, an LLM campaign with applied and verified
variants, and a non-empty export.  Three steps on two machines, the folder carried between:

    # 1. on the GPU machine (carry .device; the folder comes back under $OUT/demo)
    source .device/setup.sh && python bench/make_demo.py record --out "$OUT/demo"
    # 2. here, with a local model (the GPU machine has no model file): Qwen2.5-Coder-1.5B
    #    (bash bench/fetch_qwen.sh), whose recorded answers a re-run replays without it
    python bench/make_demo.py generate --folder examples/demo \\
        --model bench/work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --variants 12
    # 3. on the GPU machine again (carry .device and examples/demo)
    source .device/setup.sh && python bench/make_demo.py evaluate --folder examples/demo \\
        --out "$OUT/demo"

Two kernels, because no one kernel shows both at a size that ships: step 1 records nbody
(compute-bound: compiler options, the launch and the source each gain; a quarter of a MB at
scale 0.05) and reduce_sum (a naive block reduction the 1.5B model rewrites correctly: 3 of
8 of its changes verified at scale 0.05 in session 33, where on nbody 0 of 23 did; at scale
0.012 its recording is 3.6 MB).  Each goes into ``FOLDER/bundles/``, stored relative to
the database (docs/database.md), so the folder ships as a whole and ``r3 demo`` on a CPU
machine opens a copy of it.  Step 1 also runs nbody's rules-and-search campaign (its final
re-timing measures what the source, the options and the launch each gained).  Step 2 writes
the model's proposals for reduce_sum as pending variants (``r3 tune --generate-only``, each
compile-checked here and repaired once).  Step 3 evaluates them (``r3 evaluate``) and prints
what ``r3 runs`` says; every GPU figure comes from one GPU type and one code version.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (example, scale of its full size): nbody at 0.05 has 7,327 bodies (a 0.3 MB
# recording, a kernel of about a millisecond); reduce_sum at 0.012 has 805,305 floats (3.6 MB
# with its check launch, a kernel of about 13 us)
RULES = ("nbody", 0.05)
LLM = ("reduce_sum", 0.012)
DB_NAME = "r3-demo.sqlite"


def r3(*args: str) -> None:
    command = [sys.executable, "-m", "r3tui", *args]
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def bundle_of(folder: Path, example: str) -> Path:
    bundle = folder / "bundles" / f"{example}.r3b"
    if not (bundle / "manifest.json").is_file():
        raise SystemExit(f"make_demo: error: no recording {bundle} (run step 1)")
    return bundle


def record(out: Path, rules_budget: str) -> None:
    if out.exists():
        shutil.rmtree(out)
    (out / "bundles").mkdir(parents=True)
    db = out / DB_NAME
    for example, scale in (RULES, LLM):
        ex = ROOT / "examples" / example
        r3("record", "kernel", str(ex / "kernel.cu"), "--kernel", example, "--inputs",
           str(ex / "inputs.py"), "--scale", str(scale), "--out",
           str(out / "bundles" / f"{example}.r3b"), "--db", str(db))
    r3("tune", str(bundle_of(out, RULES[0])), "--rules-only", "--budget", rules_budget,
       "--name", f"{RULES[0]}-rules", "--db", str(db))


def generate(folder: Path, variants: int, model: Path | None) -> None:
    chosen = ("--model", str(model)) if model is not None else ()
    r3("tune", str(bundle_of(folder, LLM[0])), "--generate-only", "--budget", str(variants),
       "--llm-share", "1", "--repair", "--name", f"{LLM[0]}-llm", "--db", str(folder / DB_NAME),
       *chosen)


def evaluate(folder: Path, out: Path | None) -> None:
    db = folder / DB_NAME
    r3("evaluate", "--db", str(db), "--bundle", str(bundle_of(folder, LLM[0])))
    r3("runs", "--db", str(db))
    if out is not None:
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*-wal", "*-shm"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="step", required=True)
    rec = sub.add_parser("record", help="on the GPU: the recordings and the rules campaign")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--budget", default="40", help="variants of the rules campaign (40)")
    gen = sub.add_parser("generate", help="here: the model's proposals, pending")
    gen.add_argument("--folder", type=Path, required=True)
    gen.add_argument("--variants", type=int, default=8)
    gen.add_argument("--model", type=Path,
                     help="a GGUF file (default: the bundled SmolLM2; bench/fetch_qwen.sh "
                     "gives Qwen2.5-Coder-1.5B, whose answers the demo's re-run replays "
                     "without it)")
    ev = sub.add_parser("evaluate", help="on the GPU: the pending proposals evaluated")
    ev.add_argument("--folder", type=Path, required=True)
    ev.add_argument("--out", type=Path, help="copy the folder here afterwards (e.g. $OUT/demo)")
    args = parser.parse_args(argv)
    if args.step == "record":
        record(args.out, args.budget)
    elif args.step == "generate":
        generate(args.folder, args.variants, args.model)
    else:
        evaluate(args.folder, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
