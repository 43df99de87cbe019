"""The record/replay commands end to end on a GPU, through ``r3tui.cli.main``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

KERNELS = Path(__file__).resolve().parent / "kernels"


def test_record_list_verify_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    from r3tui.cli import main

    db, out = str(tmp_path / "r3.sqlite"), str(tmp_path / "axpy")
    assert main(["record", "kernel", str(KERNELS / "axpy.cu"), "--kernel", "axpy",
                 "--inputs", str(KERNELS / "axpy_inputs.py"), "--out", out, "--db", db]) == 0
    assert "recording #1" in capsys.readouterr().out

    assert main(["recordings", "--db", db]) == 0
    assert "axpy" in capsys.readouterr().out

    assert main(["record", "verify", out, "--db", db]) == 0
    assert "the original reproduces the epilogue" in capsys.readouterr().out

    assert main(["replay", out, "--db", db]) == 0
    text = capsys.readouterr().out
    assert "ok" in text and "speedup" in text and "registers" in text

    assert main(["replay", out, "--block", "128", "--option=--use_fast_math",
                 "--db", db]) == 0
    capsys.readouterr()

    assert main(["replay", out, "--source", str(KERNELS / "axpy_wrong.cu"), "--db", db]) == 1
    assert "wrong_result" in capsys.readouterr().out
