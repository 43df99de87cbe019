"""How R3 compiles an application's kernel: its device unit with NVRTC, or the whole unit with
nvcc (issue #18, docs/device-unit.md).  Measured on the corpus programs' own units, on the
machine it runs on; no GPU is needed.

For every CUDA unit of every corpus program (its compile_commands.json, written by
`bench/corpus.py prepare`): nvcc compiles the whole unit to a cubin as the application's build
does (`-cubin`, timed), which also lists the kernels the unit instantiates (the entry points a
recording would see).  For each kernel, R3 makes its device unit (headers collected the way
`r3 record` does) and compiles it with NVRTC twice (the second compile is what every candidate
after the first costs: the precompiled header is warm).  Prints a row per program and:

    device_unit_kernels_with_a_rule: R/N (a rule operator changes the kernel, seed 0)
    device_unit_kernels_compiled: C/N   (by NVRTC, else by nvcc as a campaign falls back)
    device_unit_kernels_nvrtc_ok: K/N   (kernels whose device unit NVRTC compiles)
    device_unit_programs_nvrtc_ok: P/20 (programs where it does for every kernel)
    nvrtc_compile_ms_median: first, warm
    nvcc_unit_compile_s_median: X

    python bench/device_units.py [--only P,...] [--out FILE]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from corpus import CORPUS, RECIPES  # noqa: E402

from r3tui.analysis.device_unit import DeviceUnitError, device_unit  # noqa: E402
from r3tui.compile.base import CompileRequest, first_error_line, get_toolchain  # noqa: E402
from r3tui.compile.cubin import Cubin  # noqa: E402
from r3tui.compile.nvrtc import default_include_dirs  # noqa: E402
from r3tui.record.headers import collect  # noqa: E402
from r3tui.record.sources import (  # noqa: E402
    kernel_expression,
    qualified_name,
    read_compile_db,
)


def nvcc_cubin(command_path: Path, include_dirs: list[Path], defines: list[tuple[str, str]],
               options: list[str], out: Path) -> tuple[float, bytes | None, str]:
    argv = ["nvcc", "-cubin", "-O3", "-arch=sm_90", *options,
            *(f"-I{d}" for d in include_dirs), *(f"-D{k}={v}" for k, v in defines),
            "-o", str(out), str(command_path)]
    started = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                         cwd=command_path.parent, check=False)
    seconds = time.perf_counter() - started
    if run.returncode != 0:
        return seconds, None, first_error_line(run.stderr)
    return seconds, out.read_bytes(), ""


def kernel_rows(program: str, work: Path) -> list[dict[str, object]]:
    db = CORPUS / program / "compile_commands.json"
    rows: list[dict[str, object]] = []
    nvrtc = get_toolchain("nvrtc")
    for index, command in enumerate(read_compile_db(db)):
        if command.path.suffix != ".cu":
            continue
        includes = list(command.include_dirs)
        forced = [a for f in command.forced_includes for a in ("-include", str(f))]
        seconds, cubin, error = nvcc_cubin(command.path, includes, list(command.defines),
                                           [*(o for o in command.options if o != "-Xptxas"),
                                            *forced], work / f"{program}-{index}.cubin")
        if cubin is None:
            rows.append({"program": program, "unit": command.path.name, "kernel": None,
                         "nvcc_s": seconds, "ok": False, "why": f"nvcc: {error}"})
            continue
        text = command.path.read_text(errors="replace")
        tree = collect(command.path, text, includes, forced=command.forced_includes)
        root = _root(command.path, tree.origins, tree.files)
        headers = {name: data.decode("utf-8", "replace") for name, data in tree.files}
        dirs = list(tree.include_dirs) or ["."]
        unit_dir = str(PurePosixPath(dirs[0]))
        for entry in Cubin.parse(cubin).kernel_names():
            row: dict[str, object] = {"program": program, "unit": command.path.name,
                                      "kernel": entry, "nvcc_s": seconds}
            wanted = qualified_name(entry)
            if wanted is None:
                rows.append({**row, "ok": False, "why": "cannot read the entry point"})
                continue
            scopes = [s.replace("(anonymous namespace)", "(anonymous)")
                      for s in wanted.scopes] if entry.startswith("_Z") else None
            try:
                unit = device_unit(text, wanted.name, headers, dirs or [unit_dir],
                                   cuda_include_dirs=default_include_dirs(), scopes=scopes,
                                   forced=tree.forced)
            except DeviceUnitError as exc:
                rows.append({**row, "ok": False, "why": f"device unit: {exc}"})
                continue
            request = CompileRequest(unit.text, kernel_expression(entry),
                                     defines=tuple(command.defines), source_name=command.path.name)
            first = nvrtc.compile(request)
            warm = nvrtc.compile(request) if first.ok else first
            rules = applicable_rules(unit.text, kernel_expression(entry))
            # where NVRTC cannot, a campaign compiles the device unit with nvcc (preflight)
            fallback = None if first.ok else get_toolchain("nvcc").compile(request)
            rows.append({**row, "ok": first.ok, "first_ms": first.seconds * 1e3,
                         "warm_ms": warm.seconds * 1e3, "file": unit.file or command.path.name,
                         "why": "" if first.ok else f"nvrtc: {first_error_line(first.log)}",
                         "root": str(root),
                         "rules": rules,
                         "nvcc_ok": None if fallback is None else fallback.ok,
                         "nvcc_why": "" if fallback is None or fallback.ok
                         else first_error_line(fallback.log)})
    return rows


def applicable_rules(text: str, kernel: str) -> list[str]:
    """The rule operators that change this kernel's device unit (seed 0) the way a campaign
    on an application's kernel accepts: inside the kernel's definition, its symbol kept."""
    import random

    from r3tui.remix.edits import outside_kernel_problem
    from r3tui.remix.rules import RULES, apply_rule

    found = []
    for name in RULES:
        result = apply_rule(name, text, kernel, random.Random(0))
        if result.ok and result.source is not None and \
                outside_kernel_problem(text, result.source, kernel) is None:
            found.append(name)
    return found


def _root(unit: Path, origins: tuple[Path, ...], files: tuple[tuple[str, bytes], ...]) -> Path:
    for origin, (name, _data) in zip(origins, files, strict=False):
        return Path(str(origin)[: -len(name)] if str(origin).endswith(name) else unit.parent)
    return unit.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated program names")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else None
    lines = [f"# bench/device_units.py on {platform.node()}, {platform.processor() or 'cpu'}, "
             f"{time.strftime('%Y-%m-%d %H:%M')}", f"# nvrtc: {get_toolchain('nvrtc').version()}"]
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in RECIPES:
            if wanted and recipe.name not in wanted:
                continue
            if not (CORPUS / recipe.name / "compile_commands.json").is_file():
                lines.append(f"{recipe.name}: not prepared (python bench/corpus.py prepare)")
                continue
            found = kernel_rows(recipe.name, Path(tmp))
            rows.extend(found)
            kernels = [r for r in found if r["kernel"]]
            ok = [r for r in kernels if r["ok"]]
            failed = [r for r in found if not r["ok"]]
            ruled = [r for r in kernels if r.get("rules")]
            line = (f"{recipe.name:16} kernels {len(ok)}/{len(kernels)} compile with NVRTC, "
                    f"{len(ruled)}/{len(kernels)} have a rule that applies")
            if failed:
                line += f"; first failure: {failed[0]['kernel']}: {str(failed[0]['why'])[:160]}"
                saved = [r for r in failed if r.get("nvcc_ok")]
                line += f"; nvcc compiles {len(saved)}/{len(failed)} of those device units"
                lost = [r for r in failed if r["kernel"] and not r.get("nvcc_ok")]
                if lost:
                    line += f" ({lost[0]['kernel']}: {str(lost[0]['nvcc_why'])[:120]})"
            lines.append(line)
            print(lines[-1], flush=True)
    kernels = [r for r in rows if r["kernel"]]
    ok = [r for r in kernels if r["ok"]]
    programs = {str(r["program"]) for r in rows}
    good = {p for p in programs if all(r["ok"] for r in rows if r["program"] == p)}
    first = [float(str(r["first_ms"])) for r in ok]
    warm = [float(str(r["warm_ms"])) for r in ok]
    nvcc = sorted({(str(r["program"]), str(r["unit"])): float(str(r["nvcc_s"]))
                   for r in rows}.values())
    either = [r for r in kernels if r["ok"] or r.get("nvcc_ok")]
    counts: dict[str, int] = {}
    for r in kernels:
        for name in r.get("rules") or ():  # type: ignore[attr-defined]
            counts[name] = counts.get(name, 0) + 1
    lines += [
        f"device_unit_kernels_with_a_rule: {sum(bool(r.get('rules')) for r in kernels)}/"
        f"{len(kernels)} (" + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ")",
        f"device_unit_kernels_compiled: {len(either)}/{len(kernels)} "
        f"({len(ok)} by NVRTC, {len(either) - len(ok)} by nvcc where NVRTC cannot)",
        f"device_unit_kernels_nvrtc_ok: {len(ok)}/{len(kernels)}",
        f"device_unit_programs_nvrtc_ok: {len(good)}/{len(programs)}",
        f"nvrtc_compile_ms_median: first {statistics.median(first):.0f}, "
        f"warm {statistics.median(warm):.0f}" if ok else "nvrtc_compile_ms_median: n/a",
        f"nvcc_unit_compile_s_median: {statistics.median(nvcc):.2f}" if nvcc else
        "nvcc_unit_compile_s_median: n/a",
    ]
    for line in lines[-6:]:
        print(line)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
