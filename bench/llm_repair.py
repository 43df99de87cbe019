"""What the repair turn gains at compile time, on the CPU machine, with a real local model.

For each example kernel and each transformation of the catalogue the model has no rule for
(and some it has), the model proposes one change (the campaign's own Mutator, anchored
grammar, the bundled SmolLM2 unless --model names another GGUF).  Each proposal that applies
is compiled with NVRTC for sm_90; each one that does not compile goes back to the model once
with NVRTC's first error (MutationContext.repair, as a campaign does) and the answer is
compiled again.  Prints:

    proposals: N (applied A, compiled C)
    compile_yield: C/N
    repairs: R (applied, compiled K)
    repair_compile_yield: K/R
    repair_s_per_call: mean seconds of one repair call

This is a proxy measured without a GPU: a compiled variant may still be wrong.  The issue's
`repair_yield:` needs the verification on the H200 (the variants through --generate-only
and `r3 evaluate`).

    python bench/llm_repair.py [--model FILE.gguf] [--examples a,b] [--per-kernel 6]
        [--seed 0] [--max-tokens 256] [--no-examples]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    from r3tui.compile import CompiledKernel, CompileRequest, get_toolchain
    from r3tui.compile.base import first_error_line
    from r3tui.remix.backends import BackendSpec, Sampling, open_backend
    from r3tui.remix.catalogue import CATALOGUE
    from r3tui.remix.models import bundled_model
    from r3tui.remix.mutation import Mutator, MutatorSettings
    from r3tui.remix.prompt import MutationContext

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the bundled one)")
    parser.add_argument("--examples", default="reduce_sum,softmax,spmv_csr,stencil7")
    parser.add_argument("--per-kernel", type=int, default=6, help="proposals per kernel")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=Sampling().max_tokens,
                        help="answer tokens (default: a campaign's own; session 20 ran 256, "
                        "where most answers ended at the bench's limit)")
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--no-examples", action="store_true",
                        help="ablation: the prompt's generic example instead of each "
                        "transformation's worked one")
    parser.add_argument("--search-anywhere", action="store_true",
                        help="ablation: SEARCH may copy any run of the parent's lines, the "
                        "kernel's head too (as before session 21), not only its body")
    args = parser.parse_args(argv)

    def compiles(source: str, name: str) -> CompiledKernel:
        """As a campaign compiles a variant's baseline: a tunable declared without a #define
        gets its first value as -D (the search always sets one); session 20's bench compiled
        without, and counted "identifier R3_UNROLL is undefined" against the model."""
        from r3tui.search.source import DeclarationError, parse_tunables

        try:
            defines = tuple((t.name, str(t.values[0])) for t in parse_tunables(source)
                            if t.default is None)
        except DeclarationError:
            defines = ()
        return nvrtc.compile(CompileRequest(source, name, defines=defines))

    model = args.model or bundled_model()
    if model is None:
        print("no model: give --model FILE.gguf or install the bundled one", file=sys.stderr)
        return 2
    backend = open_backend(BackendSpec(kind="llama_cpp", model_path=Path(model),
                                       n_ctx=args.n_ctx))
    mutator = Mutator(backend, MutatorSettings(
        sampling=Sampling(temperature=0.7, top_p=0.9, max_tokens=args.max_tokens),
        llm_share=1.0))
    nvrtc = get_toolchain("nvrtc")
    rng = random.Random(args.seed)
    counts = {"proposals": 0, "applied": 0, "compiled": 0, "repairs": 0, "r_applied": 0,
              "r_compiled": 0}
    repair_s: list[float] = []
    print(f"# bench/llm_repair.py, model {Path(model).name}, seed {args.seed}, "
          f"max_tokens {args.max_tokens}, "
          f"{'generic example' if args.no_examples else 'worked examples'}, SEARCH "
          f"{'anywhere in the parent' if args.search_anywhere else 'inside the kernel body'}")
    for name in args.examples.split(","):
        source = (ROOT / "examples" / name / "kernel.cu").read_text()
        for k in range(args.per_kernel):
            wanted = CATALOGUE[(k + rng.randrange(len(CATALOGUE))) % len(CATALOGUE)]
            if args.no_examples:
                wanted = replace(wanted, example=None)
            if args.search_anywhere:
                wanted = replace(wanted, signature=True)
            ctx = MutationContext(name, source, transformation=wanted)
            proposal = mutator.propose(ctx, random.Random(rng.randrange(2**31)))
            counts["proposals"] += 1
            if not proposal.ok or proposal.source is None:
                print(f"{name:10} {wanted.name:24} not applied: {proposal.reason}")
                continue
            counts["applied"] += 1
            compiled = compiles(proposal.source, name)
            if compiled.ok:
                counts["compiled"] += 1
                print(f"{name:10} {wanted.name:24} compiles")
                continue
            error = first_error_line(compiled.log)
            counts["repairs"] += 1
            fix = MutationContext(name, proposal.source, transformation=wanted,
                                  repair=f"compile_failed: {error}")
            started = time.perf_counter()
            repaired = mutator.propose(fix, random.Random(rng.randrange(2**31)))
            repair_s.append(time.perf_counter() - started)
            outcome = "not applied"
            if repaired.ok and repaired.source is not None:
                counts["r_applied"] += 1
                outcome = "does not compile"
                if compiles(repaired.source, name).ok:
                    counts["r_compiled"] += 1
                    outcome = "compiles"
            print(f"{name:10} {wanted.name:24} does not compile ({error[:60]}); "
                  f"repair {outcome}")
    backend.close()
    c = counts
    print(f"proposals: {c['proposals']} (applied {c['applied']}, compiled {c['compiled']})")
    print(f"compile_yield: {c['compiled']}/{c['proposals']}")
    print(f"repairs: {c['repairs']} (applied {c['r_applied']}, compiled {c['r_compiled']})")
    print(f"repair_compile_yield: {c['r_compiled']}/{c['repairs']}")
    if repair_s:
        print(f"repair_s_per_call: {statistics.mean(repair_s):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
