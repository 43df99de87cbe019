"""`corpus.py units`: whether each corpus kernel's device unit compiles with NVRTC, on the CPU.

A campaign on an application kernel searches its device unit (docs/device-unit.md) and
compiles it with NVRTC when NVRTC compiles the original, else with nvcc at about 2 s a
compile, which leaves a short budget almost no source variants.  The H200 corpus runs showed
that fallback only after device time was spent; this check needs no GPU.  The kernels are the
ones the recordings found (the `tune` step's profile lines in each program's state file); for
each, the unit that defines it is found in the program's compile_commands.json as `r3 record`
finds it, its headers collected, its device unit built and compiled with NVRTC and nvcc, and
the two compile times printed.

Output: one line per kernel, then `corpus_units_nvrtc: N/M` (device units NVRTC compiles) and
the median compile time of each toolchain.
"""

from __future__ import annotations

import re
import statistics
import time
from pathlib import Path
from typing import Any

_PROFILE_LINE = re.compile(r"^\s*\d+\.\s+[\d.]+%\s+[\d.]+ ms\s+\d+ launches\s+(?P<sig>.+?)\s+\[")
_CAST = re.compile(r"\((?:unsigned |signed )?(?:int|long|short|char|long long|bool)\)(-?\d+)")


def recorded_kernels(state: dict[str, Any]) -> list[str]:
    """The demangled signatures of the kernels a program's recording profiled."""
    tail = state["steps"].get("tune", {}).get("tail", [])
    return [m["sig"] for line in tail if (m := _PROFILE_LINE.match(line))]


def name_expression(signature: str) -> str:
    """``void ns::k<float, (int)2>(const T1 *, ...)`` -> ``ns::k<float, 2>``."""
    text = signature.strip()
    if text.endswith(")"):
        depth = 0
        for i in range(len(text) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                text = text[:i]
                break
    text = re.sub(r"^(?:void\s+)", "", text.strip())
    return _CAST.sub(lambda m: m.group(1), text).strip()


def check_kernel(program_dir: Path, signature: str) -> dict[str, Any]:
    from r3tui.analysis.device_unit import DeviceUnitError, device_unit
    from r3tui.compile import CompileRequest, get_toolchain
    from r3tui.compile.base import first_error_line
    from r3tui.compile.nvrtc import default_include_dirs
    from r3tui.errors import R3Error
    from r3tui.record.headers import collect
    from r3tui.record.sources import associate

    expression = name_expression(signature)
    base = re.sub(r"<.*", "", expression)
    scopes, name = base.split("::")[:-1], base.split("::")[-1]
    row: dict[str, Any] = {"kernel": expression}
    found = associate(name, [], program_dir / "compile_commands.json")
    if found is None:
        return {**row, "status": "no unit defines it"}
    row["unit"] = found.path.name
    try:
        tree = collect(found.path, found.text, found.include_dirs, forced=found.forced_includes)
        headers = {p: content.decode("utf-8", errors="replace") for p, content in tree.files}
        unit = device_unit(found.text, name, headers, list(tree.include_dirs),
                           cuda_include_dirs=default_include_dirs(),
                           scopes=scopes or None, forced=tree.forced)
    except (DeviceUnitError, R3Error) as exc:
        return {**row, "status": f"no device unit: {exc}"}
    for toolchain in ("nvrtc", "nvcc"):
        started = time.perf_counter()
        result = get_toolchain(toolchain).compile(CompileRequest(
            unit.text, expression, defines=tuple(found.defines)))
        row[f"{toolchain}_s"] = time.perf_counter() - started
        row[toolchain] = "ok" if result.ok else first_error_line(result.log)
    row["status"] = "ok" if row["nvrtc"] == "ok" else "nvrtc fails"
    return row


def check(programs: list[Path], states: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for program_dir in programs:
        state = states.get(program_dir.name)
        kernels = recorded_kernels(state) if state else []
        if not kernels:
            rows.append({"program": program_dir.name, "kernel": "-",
                         "status": "no recorded profile"})
        for signature in kernels:
            rows.append({"program": program_dir.name, **check_kernel(program_dir, signature)})
            r = rows[-1]
            print(f"{r['program']:15} {r['kernel'][:44]:44} {r.get('unit', '-'):14} "
                  f"nvrtc {r.get('nvrtc_s', 0):6.2f} s  nvcc {r.get('nvcc_s', 0):5.2f} s  "
                  f"{r['status'] if r['status'] != 'nvrtc fails' else r['nvrtc']}"[:220],
                  flush=True)
    compiled = [r for r in rows if "nvrtc" in r]
    ok = [r for r in compiled if r["nvrtc"] == "ok"]
    print(f"corpus_units_nvrtc: {len(ok)}/{len(rows)} (device units of recorded kernels NVRTC "
          "compiles; the rest fall back to nvcc or are not searched)")
    if ok:
        print(f"nvrtc_compile_s_median: {statistics.median(r['nvrtc_s'] for r in ok):.3f}")
    nvcc_ok = [r for r in compiled if r.get("nvcc") == "ok"]
    if nvcc_ok:
        print(f"nvcc_compile_s_median: {statistics.median(r['nvcc_s'] for r in nvcc_ok):.3f}")
    return rows
