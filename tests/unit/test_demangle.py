"""One demangler for the recorder and the compilers (r3tui/demangle.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from r3tui.demangle import demangle, demangle_all

SYMBOLS = ["_ZN2cg11dot_partialILi256EEEvPKdS2_Pdi", "_Z4axpyIfEvT_PKS0_PS0_i", "scale", ""]


@pytest.mark.skipif(shutil.which("c++filt") is None and shutil.which("cu++filt") is None,
                    reason="no demangler installed")
def test_several_symbols_through_one_process_and_plain_names_left_alone() -> None:
    names = demangle_all(SYMBOLS)
    assert set(names) == set(SYMBOLS[:2])  # "scale" and "" are not mangled
    assert names[SYMBOLS[0]].replace("(int)", "") == (
        "void cg::dot_partial<256>(double const*, double const*, double*, int)")
    assert names[SYMBOLS[1]].startswith("void axpy<float>(float, float const*, float*, int)")
    assert demangle(SYMBOLS[1]) == names[SYMBOLS[1]] and demangle("scale") is None


def test_without_a_demangler_names_stay_mangled(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # neither cu++filt nor c++filt
    assert demangle_all(SYMBOLS) == {} and demangle(SYMBOLS[0]) is None
