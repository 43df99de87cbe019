"""bench/llm_generate.py: compile yields of generate-only databases, per model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from db import repository as repo
from db.session import open_database
from r3tui.domain import Campaign, LLMCall, Variant, VariantOrigin, VariantStatus
from tests.db.factories import recording

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from llm_generate import failure_class, main

QWEN = "/m/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SMOL = "/m/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_yields_split_first_answers_from_repairs(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gen.sqlite"
    database = open_database(path)
    try:
        with database.session_scope() as s:
            rid = repo.add_recording(s, recording("nbody"), {})
            cid = repo.create_campaign(s, Campaign("nbody-gen", rid, seed=0))
            seed = repo.add_variant(s, Variant(cid, "seed", VariantOrigin.SEED))
            for i, (model, origin, status, op, reason) in enumerate((
                (QWEN, VariantOrigin.LLM, VariantStatus.PENDING, "hoist_invariant_loads", None),
                (QWEN, VariantOrigin.LLM, VariantStatus.COMPILE_FAILED, "shared_memory_tile",
                 'kernel.cu(21): error: identifier "tile" is undefined'),
                (QWEN, VariantOrigin.REPAIR, VariantStatus.COMPILE_FAILED, "shared_memory_tile",
                 "kernel.cu(40): error: expected a declaration"),
                (QWEN, VariantOrigin.LLM, VariantStatus.VERIFIED, "simplify_index_math", None),
                (SMOL, VariantOrigin.LLM, VariantStatus.APPLY_FAILED, "fuse_loops",
                 "edit 1: its SEARCH text is not in the kernel"),
                (SMOL, VariantOrigin.REPAIR, VariantStatus.UNSAFE, "fuse_loops",
                 "host function 'main' (line 49) is not in the original"),
            )):
                call_id = repo.add_llm_call(s, cid, LLMCall(model, "0" * 64, "p", "r", {}, 0,
                                                            10, 10, 1.0))
                repo.add_variant(s, Variant(cid, f"v{i}", origin, parent_id=seed, status=status,
                                            operator=op, status_reason=reason,
                                            llm_call_id=call_id))
            # a rule's variant is not the model's
            repo.add_variant(s, Variant(cid, "r", VariantOrigin.RULE, parent_id=seed,
                                        status=VariantStatus.COMPILE_FAILED, operator="coarsen"))
    finally:
        database.close()
    assert main([str(path), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "llm_compile_yield_qwen2.5: 2/4 (first answers 2/3, repairs 0/1)" in out
    assert "valid_variant_yield_qwen2.5: 1/4 (1 of 2 compiled evaluated)" in out
    assert "llm_compile_yield_smollm2: 0/2 (first answers 0/1, repairs 0/1)" in out
    assert "  failures: did not apply 1, refused as unsafe 1" in out
    assert not any(line.startswith("valid_variant_yield_smollm2") for line in out)
    failures = out[out.index("llm_compile_yield_qwen2.5: 2/4 (first answers 2/3, repairs 0/1)")
                   + 2]
    assert failures == "  failures: undefined identifier 1, braces 1"
    assert sum("coarsen" in line for line in out) == 0
    assert sum(line.startswith("  gen.sqlite #") for line in out) == 6


def test_failure_classes_and_a_missing_database(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert failure_class('error: "acc" has already been declared in the current scope') == (
        "declared twice")
    assert failure_class('At end of source: error: expected a "}"') == "braces"
    assert failure_class("error: unrecognized token") == "other"
    assert main([str(tmp_path / "none.sqlite")]) == 2
    assert capsys.readouterr().err.startswith("llm_generate.py: error: no such database:")
