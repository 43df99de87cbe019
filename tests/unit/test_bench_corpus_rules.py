"""bench/corpus_rules.py on a corpus of two small programs written here: one row a kernel with
the rules that apply, the counts, and one error line with exit 2 where there is no corpus."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import corpus_rules

CHECKED = """__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    y[i] = 2.0f * x[i];
}
"""
OLD_STYLE = """#define REAL double
__global__ void older(REAL* y, int n) {
    int i, j;
    i = blockDim.x * blockIdx.x + threadIdx.x;
    if (i >= n) return;
    for (j = 0; j < 4; j++) y[i] += (REAL)j;
}
__host__ void not_a_kernel() {}
"""


def test_one_row_a_kernel_and_the_counts(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "main.cu").write_text(CHECKED)
    (tmp_path / "two" / "include").mkdir(parents=True)
    (tmp_path / "two" / "include" / "k.cuh").write_text(OLD_STYLE)
    (tmp_path / "_deps").mkdir()  # helpers' folders are not programs
    (tmp_path / "_deps" / "x.cu").write_text(CHECKED.replace("scale", "hidden"))
    out = tmp_path / "report.txt"
    assert corpus_rules.main(["--corpus", str(tmp_path), "--rules", "coarsen,grid_stride",
                              "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    rows = [ln.split() for ln in printed.splitlines() if ln.startswith(("one", "two"))]
    assert rows == [["one", "main.cu", "scale", "coarsen", "grid_stride"],
                    ["two", "k.cuh", "older", "coarsen", "grid_stride"]]
    assert "corpus_rules_apply[coarsen]: 2/2" in printed
    assert "hidden" not in printed


def test_no_corpus_or_an_unknown_rule_is_one_error_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert corpus_rules.main(["--corpus", str(tmp_path / "absent")]) == 2
    assert corpus_rules.main(["--corpus", str(tmp_path), "--rules", "nope"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2 and all(e.startswith("corpus_rules.py: error: ") for e in errors)
    assert "unknown rules nope" in errors[1]
