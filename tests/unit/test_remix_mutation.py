"""The mutator without a model: rule proposals, and model answers replayed through
RecordedBackend (the ``--replay-llm`` backend) with answers written for these tests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from r3tui.compile import CompileRequest, get_toolchain
from r3tui.domain import LLMCall, VariantOrigin
from r3tui.remix.backends import Sampling, render_prompt
from r3tui.remix.catalogue import Transformation, transformation
from r3tui.remix.mutation import ANCHORED_GRAMMAR, Mutator, MutatorSettings
from r3tui.remix.prompt import MutationContext, build_messages
from r3tui.remix.recorded import RecordedBackend, ReplayDiverged

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SGEMM = (EXAMPLES / "sgemm" / "kernel.cu").read_text()
STENCIL = (EXAMPLES / "stencil7" / "kernel.cu").read_text()
LOOP = "    for (int k = 0; k < K; ++k) {\n"


def recorded(
    ctx: MutationContext, response: str, grammar: str | None = ANCHORED_GRAMMAR
) -> LLMCall:
    """The call a model would have made for ``ctx``, answering ``response``."""
    return LLMCall(
        model_path="/models/written-for-the-test.gguf",
        model_sha256="0" * 64,
        prompt=render_prompt(build_messages(ctx)),
        response=response,
        sampling={**Sampling().to_json(grammar)},
        seed=1,
        tokens_in=100,
        tokens_out=20,
        latency_s=0.5,
    )


def edit(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


def llm_ctx(name: str = "unroll_inner_loop", fmt: str = "search_replace") -> MutationContext:
    return MutationContext("sgemm", SGEMM, transformation=transformation(name), edit_format=fmt)


def test_rules_only_mutator_proposes_a_compiling_rule_variant() -> None:
    mutator = Mutator(None)
    proposal = mutator.propose(MutationContext("stencil7", STENCIL), random.Random(5))
    assert proposal.ok and proposal.origin is VariantOrigin.RULE and proposal.llm_call is None
    assert proposal.source is not None and proposal.diff is not None
    assert proposal.transformation.rule is not None
    assert proposal.operator == proposal.transformation.name
    assert proposal.diff.startswith("--- parent/kernel.cu\n+++ variant/kernel.cu\n")
    compiled = get_toolchain("nvrtc").compile(CompileRequest(proposal.source, "stencil7"))
    assert compiled.ok, compiled.log
    again = mutator.propose(MutationContext("stencil7", STENCIL), random.Random(5))
    assert again == proposal  # the campaign's seed fixes the mutation


def test_rules_skip_sources_the_campaign_already_has() -> None:
    mutator = Mutator(None)
    first = mutator.propose(MutationContext("stencil7", STENCIL), random.Random(5))
    assert first.ok and first.source is not None
    known = {first.source}
    second = mutator.propose(
        MutationContext("stencil7", STENCIL, is_known=known.__contains__), random.Random(5)
    )
    # the same draw, but the first rule's result is known: the next rule that gives a new one
    assert second.ok and second.source is not None and second.source not in known
    assert second.operator != first.operator
    # every rule's result known: a failed proposal that says why for each
    none_new = mutator.propose(
        MutationContext("stencil7", STENCIL, is_known=lambda _source: True), random.Random(5)
    )
    assert not none_new.ok and none_new.source is None
    assert none_new.reason is not None and none_new.reason.startswith("no rule applies")
    assert "gives a variant the campaign has" in none_new.reason


def test_no_rule_applies_is_a_failed_proposal_naming_each_rule() -> None:
    source = 'extern "C" __global__ void k(int n) { }\n'
    proposal = Mutator(None).propose(MutationContext("k", source), random.Random(0))
    assert not proposal.ok and proposal.source is None and proposal.diff is None
    assert proposal.reason is not None and proposal.reason.startswith("no rule applies")
    for rule in ("restrict_const", "ldg_loads", "unroll_pragma", "expose_tunable"):
        assert rule in proposal.reason


def test_a_requested_transformation_without_rule_needs_the_model() -> None:
    ctx = MutationContext("sgemm", SGEMM, transformation=transformation("hoist_invariant_loads"))
    proposal = Mutator(None).propose(ctx, random.Random(0))
    assert not proposal.ok and "needs the model" in (proposal.reason or "")
    with pytest.raises(Exception, match="needs a model"):
        Mutator(None).propose_llm(ctx, random.Random(0))


def test_model_answer_is_parsed_applied_and_diffed() -> None:
    ctx = llm_ctx()
    answer = "Here you go:\n" + edit(LOOP, "    #pragma unroll 4\n" + LOOP)
    call = recorded(ctx, answer)
    mutator = Mutator(RecordedBackend([call]), MutatorSettings(llm_share=1.0))
    proposal = mutator.propose(ctx, random.Random(0))
    assert proposal.ok, proposal.reason
    assert proposal.origin is VariantOrigin.LLM and proposal.llm_call == call
    assert proposal.operator == "unroll_inner_loop" and proposal.detail == "1 edit(s)"
    assert proposal.source == SGEMM.replace(LOOP, "    #pragma unroll 4\n" + LOOP)
    assert "+    #pragma unroll 4\n" in (proposal.diff or "")
    compiled = get_toolchain("nvrtc").compile(CompileRequest(proposal.source or "", "sgemm"))
    assert compiled.ok, compiled.log


def test_a_model_answer_applies_in_part_and_says_what_was_left_out() -> None:
    ctx = llm_ctx()
    answer = (
        edit(LOOP, "    #pragma unroll 4\n" + LOOP)
        + edit("    float no_such_line;\n", "x\n")
        + "<<<<<<< SEARCH\n    float acc"
    )
    mutator = Mutator(RecordedBackend([recorded(ctx, answer)]), MutatorSettings(llm_share=1.0))
    proposal = mutator.propose(ctx, random.Random(0))
    assert proposal.ok, proposal.reason
    assert proposal.source == SGEMM.replace(LOOP, "    #pragma unroll 4\n" + LOOP)
    assert proposal.detail == (
        "1 of 2 edit(s); skipped edit 2: its SEARCH text is not in the kernel; "
        "left out: the answer ends inside edit 3 (cut off at max_tokens?)"
    )


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        ("I cannot help with that.", "no SEARCH/REPLACE block"),
        (edit("    for (int j = 0; j < N; ++j) {\n", "x\n"), "not in the kernel"),
        ("<<<<<<< SEARCH\n" + LOOP + "=======\n", "ends inside edit 1"),
        (
            edit(
                "                                 float beta, float* C)\n",
                "                                 double beta, float* C)\n",
            ),
            "parameters of sgemm changed",
        ),
        (edit(LOOP, "    // r3: tune\n" + LOOP), "r3 declarations do not parse"),
        (edit(LOOP, "    // r3: exact w\n" + LOOP), "is not a list of axes"),
    ],
)
def test_bad_model_answers_are_failed_proposals_that_keep_the_call(
    answer: str, reason: str
) -> None:
    ctx = llm_ctx()
    call = recorded(ctx, answer)
    proposal = Mutator(RecordedBackend([call])).propose_llm(ctx, random.Random(0))
    assert not proposal.ok and proposal.source is None
    assert reason in (proposal.reason or ""), proposal.reason
    assert proposal.llm_call == call  # recorded, so the tree shows what the model said


def test_whole_kernel_answers() -> None:
    ctx = llm_ctx("restrict_const", "whole")
    kernel = SGEMM[SGEMM.index('extern "C"') :].replace(
        "const float* A, const float* B", "const float* __restrict__ A, const float* __restrict__ B"
    )
    call = recorded(ctx, f"```cuda\n{kernel}```\n", grammar="fenced_cuda")
    proposal = Mutator(RecordedBackend([call])).propose_llm(ctx, random.Random(0))
    assert proposal.ok, proposal.reason
    assert proposal.source is not None and proposal.source.startswith("// Single-precision GEMM")
    assert "const float* __restrict__ B" in proposal.source


def test_replay_diverges_on_another_prompt_grammar_or_too_many_calls() -> None:
    ctx = llm_ctx()
    call = recorded(ctx, edit(LOOP, "    #pragma unroll 2\n" + LOOP))
    other = llm_ctx("fuse_loops")
    with pytest.raises(ReplayDiverged, match=r"prompt differs .* at character"):
        Mutator(RecordedBackend([call])).propose_llm(other, random.Random(0))
    no_grammar = Mutator(RecordedBackend([call]), MutatorSettings(use_grammar=False))
    with pytest.raises(ReplayDiverged, match="grammar"):
        no_grammar.propose_llm(ctx, random.Random(0))
    backend = RecordedBackend([call])
    assert Mutator(backend).propose_llm(ctx, random.Random(0)).ok
    assert backend.remaining == 0
    with pytest.raises(ReplayDiverged, match="recorded only 1"):
        Mutator(backend).propose_llm(ctx, random.Random(0))


def test_llm_share_decides_the_source_and_rules_fill_in() -> None:
    ctx = MutationContext("sgemm", SGEMM)
    rules_only = Mutator(RecordedBackend([]), MutatorSettings(llm_share=0.0))
    origins = {rules_only.propose(ctx, random.Random(s)).origin for s in range(5)}
    assert origins == {VariantOrigin.RULE}
    # Where no rule applies, the model is asked (here it has nothing recorded: divergence).
    nothing = MutationContext("k", 'extern "C" __global__ void k(int n) { }\n')
    with pytest.raises(ReplayDiverged):
        rules_only.propose(nothing, random.Random(0))


def test_mutator_settings_are_checked() -> None:
    with pytest.raises(Exception, match="edit format"):
        MutatorSettings(edit_format="patch")
    with pytest.raises(Exception, match="llm_share"):
        MutatorSettings(llm_share=1.5)
    assert isinstance(transformation("fuse_loops"), Transformation)


def _runs(grammar: str) -> list[tuple[list[int], int]]:
    """Every SEARCH run an anchored grammar allows: its line numbers and the most lines its
    REPLACE section may have."""
    import re

    rules = dict(re.findall(r"^(\S+) ::= (.*)$", grammar, re.M))
    runs: list[tuple[list[int], int]] = []

    def walk(name: str, seen: list[int]) -> None:
        head, _, rest = rules[name].partition(" ")
        line = [*seen, int(head[2:])]
        for way in rest.strip("()").split(" | "):
            if way.startswith("rp"):
                bound = re.search(r"line\{0,(\d+)\}", rules[way])
                assert bound is not None
                runs.append((line, int(bound.group(1))))
            else:
                walk(way, line)

    for start in rules["search"].split(" | "):
        walk(start, [])
    return runs


def test_an_anchored_search_copies_at_most_a_run_of_the_parents_lines() -> None:
    """SmolLM2 spent most answers copying the kernel into SEARCH until max_tokens: a run of
    the parent's lines now ends after SEARCH_RUN lines, and its REPLACE section after
    REPLACE_EXTRA lines more."""
    from r3tui.remix.mutation import REPLACE_EXTRA, SEARCH_RUN, anchored_search_grammar

    parent = "".join(f"    x{i} = y{i};\n" for i in range(40))
    grammar = anchored_search_grammar(parent)
    runs = _runs(grammar)
    assert max(len(lines) for lines, _ in runs) == SEARCH_RUN
    assert all(bound == len(lines) + REPLACE_EXTRA for lines, bound in runs)
    assert all(lines == list(range(lines[0], lines[0] + len(lines))) for lines, _ in runs)
    assert len(runs) == sum(min(SEARCH_RUN, 40 - i) for i in range(40))
    # the text of each line is written once, whatever the depth it is copied at
    assert grammar.count('"    x20 = y20;\\n"') == 1


def test_an_anchored_search_closes_every_brace_it_opens() -> None:
    """Qwen2.5-Coder's SEARCH stopped at the run's cap inside nbody's loop and its REPLACE
    closed the loop: a brace too many, or the body twice (session 37).  A run is whole
    statements: it never ends inside a block it opened, never starts inside one it closes."""
    from r3tui.remix.mutation import _braces, anchored_search_grammar

    parent = ('extern "C" __global__ void k(float* y, const float* x, int n)\n'
              "{\n"
              "    int i = threadIdx.x;\n"
              "    float s = 0.0f;  // a { in a comment\n"
              "    for (int j = 0; j < n; ++j) {\n"
              "        if (x[j] > 0.0f) {\n"
              "            s += x[j];\n"
              "        } else {\n"
              "            s -= x[j];\n"
              "        }\n"
              "    }\n"
              "    y[i] = s + '}';\n"
              "}\n")
    lines = parent.splitlines()
    runs = [r for r, _ in _runs(anchored_search_grammar(parent, "k"))]
    assert [2] in runs and [3] in runs and [6] in runs and [11] in runs
    assert [4] not in runs and [5] not in runs and [7] not in runs and [4, 5, 6] not in runs
    assert list(range(4, 11)) in runs and list(range(5, 10)) in runs  # the loop, the if/else
    for run in runs:
        depth = 0
        for index in run:
            net, lowest = _braces(lines[index])
            assert depth + lowest >= 0, run
            depth += net
        assert depth == 0, run
    # a change to the parameter list copies the kernel's head: no run there is held to braces
    head = [r for r, _ in _runs(anchored_search_grammar(parent))]
    assert [0] in head and [0, 1] in head and [4] in head
    assert _braces("        } else {") == (0, -1)
    assert _braces("    y[i] = s + '}';  // }") == (0, 0)


def test_an_anchored_search_stays_inside_the_kernels_body_unless_the_change_needs_its_head(
        ) -> None:
    """SmolLM2's SEARCH ran from the first line of code over the kernel's signature, and its
    REPLACE left the signature out: the entry point was gone in 9 of 20 answers."""
    import re

    from r3tui.remix.mutation import anchored_search_grammar

    parent = ('#define N 4\n'
              'extern "C" __global__ void k(float* y, const float* x)\n'
              '{\n'
              '    int i = threadIdx.x;\n'
              '    y[i] = x[i] * N;\n'
              '}\n'
              '__device__ float other() { return 1.0f; }\n')
    body = anchored_search_grammar(parent, "k")
    literals = set(re.findall(r'^pt\d+ ::= "(.*)"$', body, re.M))
    assert literals == {"    int i = threadIdx.x;\\n", "    y[i] = x[i] * N;\\n"}
    whole = anchored_search_grammar(parent)
    assert 'extern \\"C\\" __global__ void k' in whole and "#define N 4" in whole
    # restrict_const edits the parameter list: its grammar keeps the head
    from r3tui.remix.catalogue import CATALOGUE

    assert [t.name for t in CATALOGUE if t.signature] == ["restrict_const"]


def test_exposing_a_tunable_may_search_the_directives_above_the_kernel_not_its_head() -> None:
    """Asked to expose a tunable with the body alone to search in, Qwen2.5-Coder replaced a
    declaration of reduce_sum's body by the guarded ``#define`` (2 of 2 answers failed on
    the name it removed, session 47): the change edits a directive above the kernel."""
    from r3tui.remix.catalogue import CATALOGUE
    from r3tui.remix.mutation import SEARCH_RUN, anchored_search_grammar

    parent = ('// a comment\n'
              '#ifndef N\n'
              '#define N 4\n'
              '#endif\n'
              'static const int M = 2;\n'
              '#define SCALE 2.0f\n'
              'extern "C" __global__ void k(float* y, const float* x)\n'
              '{\n'
              '    int i = threadIdx.x;\n'
              '    y[i] = x[i] * N;\n'
              '}\n')
    runs = [r for r, _ in _runs(anchored_search_grammar(parent, "k", macros=True))]
    directives = [r for r in runs if r[0] < 8]
    assert sorted(directives) == [[1], [1, 2], [1, 2, 3], [2], [2, 3], [3], [5]]
    assert [8] in runs and [9] in runs and [8, 9] in runs  # the body, as without
    assert not any(0 in r or 4 in r or 6 in r or 7 in r for r in runs)  # no head, no code
    assert [r for r, _ in _runs(anchored_search_grammar(parent, "k"))] == \
        [r for r in runs if r[0] >= 8]
    many = "".join(f"#define D{i} {i}\n" for i in range(30)) + parent
    assert max(len(r) for r, _ in _runs(anchored_search_grammar(many, "k", macros=True))) \
        == SEARCH_RUN
    assert [t.name for t in CATALOGUE if t.macros] == ["expose_tunable"]


def test_the_mutator_lets_only_a_unit_of_its_own_search_its_directives() -> None:
    """An application's device unit (confined) keeps SEARCH in the kernel's definition: r3
    apply writes back only that."""
    from r3tui.remix.backends import Completion

    parent = '#define N 4\nextern "C" __global__ void k(float* y)\n{\n    y[0] = N;\n}\n'
    grammars: list[str | None] = []

    class Recording:  # a named fake: it answers nothing and keeps the grammar it was given
        name = "recording"
        n_ctx = 4096

        def complete(self, messages: object, *, sampling: object, grammar: str | None = None,
                     grammar_name: str | None = None, check: object = None) -> Completion:
            grammars.append(grammar)
            call = LLMCall("recording", "00" * 32, "", "", {}, None, 0, 0, 0.0)
            return Completion(text="", call=call, finish_reason="stop")

    mutator = Mutator(Recording())  # type: ignore[arg-type]
    tunable = transformation("expose_tunable")
    mutator.propose_llm(MutationContext("k", parent, transformation=tunable), random.Random(0))
    mutator.propose_llm(MutationContext("k", parent, transformation=tunable, confined=True),
                        random.Random(0))
    mutator.propose_llm(MutationContext("k", parent, transformation=transformation(
        "unroll_inner_loop")), random.Random(0))
    own, confined, other = grammars
    assert own is not None and '"#define N 4\\n"' in own
    assert confined is not None and "#define N 4" not in confined
    assert other is not None and "#define N 4" not in other


def test_a_variant_whose_first_line_does_not_parse_is_a_declaration_problem() -> None:
    """A model that copies a tile's ``// r3: first`` line with a value its tunable lacks would
    stop the inner loop at the child's first configuration: the proposal fails first."""
    from r3tui.remix.mutation import declaration_problem

    good = "// r3: tune R3_TILE 0 4 8 16 32 64\n// r3: first R3_TILE 64 32\n"
    assert declaration_problem(good) is None
    problem = declaration_problem(good.replace("64 32", "128"))
    assert problem is not None and "first R3_TILE" in problem
