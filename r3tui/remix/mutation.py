"""One mutation of a parent kernel: by the language model or by a rule, as a :class:`Proposal`.

The :class:`Mutator` picks the source (the model for a ``llm_share`` of proposals when there is
one, rules otherwise or when the model is absent) and a transformation from the catalogue,
builds the prompt, asks the backend under the answer format's grammar, parses and applies the
answer, and diffs the result against the parent.  For SEARCH/REPLACE answers the grammar is
built from the parent (``anchor_search``): SEARCH text can only be a run of the parent's own
lines, so the commonest failure of a small model, a SEARCH text that is not in the kernel,
cannot happen; the recorded grammar name is then ``search_replace_anchored``.

Every way a model's answer can be wrong (unparseable, cut off, not matching the parent, a
changed entry point, malformed ``// r3:`` lines) is a failed proposal with its reason, never
an exception; a prompt too long for the context is retried without inspirations, then failed
the same way.  A backend that cannot
answer at all (server down, model not loadable) raises
:class:`~r3tui.remix.backends.BackendError`: that stops a campaign rather than failing every
proposal.

Random choices come from the ``rng`` passed in (the campaign's), including the sampling seed
when the settings fix none, so a re-run with the same seed asks the same questions, which is
what :class:`~r3tui.remix.recorded.RecordedBackend` needs.  A mutator may be called from a
background thread; backend calls are serialized.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import random
import re
import threading
from dataclasses import dataclass, field
from importlib import resources

from r3tui.analysis.facts import tokens
from r3tui.domain import LLMCall, VariantOrigin
from r3tui.errors import ConfigError
from r3tui.remix.backends import AnswerCheck, Completion, LLMBackend, PromptTooLong, Sampling
from r3tui.remix.balance import BalanceCheck, Checks
from r3tui.remix.catalogue import CATALOGUE, Transformation, mechanical
from r3tui.remix.edits import (
    ApplyResult,
    apply_edits,
    apply_whole,
    find_kernel,
    outside_kernel_problem,
    parse_search_replace,
    parse_whole,
)
from r3tui.remix.names import IdentifierCheck
from r3tui.remix.prompt import EDIT_FORMATS, MutationContext, build_messages
from r3tui.remix.rules import LAUNCH_RULES, SHARED_MEMORY_RULES, SQUARE_WORK_RULES, apply_rule

# The grammar that forces each answer format (grammars/<name>.gbnf).
GRAMMAR_FOR_FORMAT = {"search_replace": "search_replace", "whole": "fenced_cuda"}
ANCHORED_GRAMMAR = "search_replace_anchored"  # its search rule built from the parent
_SEARCH_RULE = re.compile(r"^search[ \t]+::=.*$", re.MULTILINE)


@functools.cache
def load_grammar(name: str) -> str:
    """The rules of ``grammars/<name>.gbnf``, its comment lines left out (they are for people;
    a remote server need not parse them)."""
    path = resources.files("r3tui.remix").joinpath("grammars", f"{name}.gbnf")
    if not path.is_file():
        raise ConfigError(f"no grammar {name!r}", hint=f"known: {', '.join(GRAMMAR_FOR_FORMAT)}")
    lines = path.read_text("utf-8").splitlines()
    return "".join(line + "\n" for line in lines if not line.lstrip().startswith("#"))


def gbnf_literal(text: str) -> str:
    """``text`` as the inside of a GBNF string literal."""
    escapes = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    return "".join(
        escapes.get(c) or (f"\\x{ord(c):02X}" if ord(c) < 0x20 or ord(c) == 0x7F else c)
        for c in text
    )


SEARCH_RUN = 20  # lines of the parent one anchored SEARCH section may copy
REPLACE_EXTRA = 12  # lines a REPLACE section may have beyond those of its SEARCH section
_BLOCK_RULE = re.compile(r"^block[ \t]+::=.*$", re.MULTILINE)
_REPLACE_RULE = re.compile(r"^replace[ \t]+::=.*\n", re.MULTILINE)


def _braces(line: str) -> tuple[int, int]:
    """``(net, lowest)``: the line's braces opened less closed, and the lowest that count
    falls to along the line (a ``} else {`` closes one before it opens one), over its C++
    tokens (:func:`r3tui.analysis.facts.tokens`: comments and literals hold no brace)."""
    net = lowest = 0
    for token in tokens(line):
        if token == "{":
            net += 1
        elif token == "}":
            net -= 1
            lowest = min(lowest, net)
    return net, lowest


def _line_then(i: int, ways: list[str]) -> str:
    """A grammar rule's body: line ``i``'s text, then one of ``ways``."""
    return f"pt{i} " + (ways[0] if len(ways) == 1 else f"({' | '.join(ways)})")


def _directive(lines: list[str], index: int) -> bool:
    return lines[index].lstrip().startswith("#")


def anchored_search_grammar(parent: str, body_of: str | None = None,
                            macros: bool = False) -> str:
    """The SEARCH/REPLACE grammar with SEARCH text limited to runs of consecutive lines of
    ``parent`` (starting at a line of code), so that a model copies them exactly: the most
    common way a small model's edit fails is a SEARCH text that is not in the kernel.

    Within a kernel's body (``body_of``), a run closes every brace it opens and never closes
    one it did not open (a whole statement, loop or block, never the head of a loop without
    its end): Qwen2.5-Coder's
    SEARCH ran to the run's cap in the middle of nbody's loop, and its REPLACE, which closed the
    loop, left the kernel with a brace too many or a body twice (session 37, 8 of 12 answers
    were cut at 12 lines).  A run is at most :data:`SEARCH_RUN` lines, so a small model cannot
    spend its answer copying the whole kernel into SEARCH (SmolLM2 on the CPU machine: 13 to 16
    of 20 answers were cut off there, bench/llm_repair.py), and its REPLACE section at most
    :data:`REPLACE_EXTRA` lines longer, so an answer ends.

    ``body_of``: a kernel's name; the runs then lie inside its body, between the lines of its
    opening and closing braces.  SmolLM2's SEARCH started at the first line of code and ran
    over the kernel's signature, which its REPLACE then left out: 12 of 20 answers on the CPU
    machine removed the entry point, 2 of 20 with this (bench/llm_repair.py, max_tokens
    512; bench/results/2026-12-04-llm-search-body-s21-cpu.txt).

    ``macros``: runs of consecutive preprocessor lines outside the body (``#ifndef``,
    ``#define``, ``#endif`` above the kernel) may be SEARCH text too, without the signature
    between them and the body.  Exposing a tunable edits a ``#define``, and asked for it with
    the body alone to search in, Qwen2.5-Coder replaced a declaration of the body by the
    guarded ``#define`` (reduce_sum, 2 of 2 answers failed on the name it removed, session 47,
    bench/llm_entries.py)."""
    lines = parent.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lo, hi = 0, len(lines) - 1
    span = find_kernel(parent, body_of) if body_of is not None else None
    if span is not None:
        first = parent.count("\n", 0, span.body_open) + 1
        last = parent.count("\n", 0, span.body_end - 1) - 1
        if first <= last:
            lo, hi = first, last
    # a change to the parameter list (no body_of) copies the head, whose brace may open the
    # body: those runs end anywhere
    braces = [_braces(line) if span is not None else (0, 0) for line in lines]

    # pl<i>-<d>-<b>: line i as the d-th line of a run whose braces before it leave b open
    @functools.cache
    def can_end(i: int, d: int, b: int) -> bool:
        net, lowest = braces[i]
        if b + lowest < 0:
            return False
        after = b + net
        return after == 0 or (i + 1 <= hi and d + 1 < SEARCH_RUN and can_end(i + 1, d + 1, after))

    rules: dict[str, str] = {}
    used: set[int] = set()
    lengths: set[int] = set()

    def emit(i: int, d: int, b: int) -> str:
        name = f"pl{i}-{d}-{b}"
        if name not in rules:
            rules[name] = ""
            used.add(i)
            after = b + braces[i][0]
            ways = []
            if after == 0:
                ways.append(f"rp{d + 1}")
                lengths.add(d + 1)
            if i + 1 <= hi and d + 1 < SEARCH_RUN and can_end(i + 1, d + 1, after):
                ways.append(emit(i + 1, d + 1, after))
            rules[name] = _line_then(i, ways)
        return name

    def emit_directives(i: int, d: int) -> str:
        """A run of preprocessor lines from line i, the d-th line of the run: it ends at any
        of them, and goes on only through the directives that follow at once."""
        name = f"pd{i}-{d}"
        if name not in rules:
            used.add(i)
            lengths.add(d + 1)
            ways = [f"rp{d + 1}"]
            if (i + 1 < len(lines) and not lo <= i + 1 <= hi and d + 1 < SEARCH_RUN
                    and _directive(lines, i + 1)):
                ways.append(emit_directives(i + 1, d + 1))
            rules[name] = _line_then(i, ways)
        return name

    starts = []
    for index in range(lo, hi + 1):
        code = lines[index].strip()
        if code and not code.startswith(("//", "/*", "*")) and can_end(index, 0, 0):
            starts.append(emit(index, 0, 0))
    if macros and span is not None:
        for index in range(len(lines)):
            if not lo <= index <= hi and _directive(lines, index):
                starts.append(emit_directives(index, 0))

    base = load_grammar(GRAMMAR_FOR_FORMAT["search_replace"])
    if not starts:
        return base
    text = [f"search ::= {' | '.join(starts)}"]
    text += [f'pt{i} ::= "{gbnf_literal(lines[i] + chr(10))}"' for i in sorted(used)]
    text += [f"{name} ::= {rule}" for name, rule in rules.items()]
    text += [f'rp{n} ::= "=======\\n" line{{0,{n + REPLACE_EXTRA}}}' for n in sorted(lengths)]
    base = _REPLACE_RULE.sub("", base, count=1)
    base = _BLOCK_RULE.sub(lambda _: 'block ::= "<<<<<<< SEARCH\\n" search '
                           '">>>>>>> REPLACE\\n"', base, count=1)
    return _SEARCH_RULE.sub(lambda _: "\n".join(text), base, count=1)


@dataclass(frozen=True)
class MutatorSettings:
    edit_format: str = field(
        default="search_replace",
        metadata={"help": "how the model answers: search_replace edits or the whole kernel"},
    )
    sampling: Sampling = field(
        default_factory=Sampling, metadata={"help": "temperature, top_p, max_tokens, seed"}
    )
    llm_share: float = field(
        default=0.8,
        metadata={"help": "fraction of proposals from the model when there is one (rest: rules)"},
    )
    use_grammar: bool = field(
        default=True, metadata={"help": "constrain answers with the format's GBNF grammar"}
    )
    anchor_search: bool = field(
        default=True,
        metadata={"help": "allow only runs of the parent's own lines as SEARCH text (grammar)"},
    )
    check_names: bool = field(
        default=True,
        metadata={"help": "refuse, while sampling, REPLACE tokens that use a name the unit "
                          "does not have and the answer does not declare (llama.cpp only)"},
    )
    check_balance: bool = field(
        default=True,
        metadata={"help": "refuse, while sampling, the end of a REPLACE section whose braces, "
                          "parentheses or brackets do not balance as its SEARCH section's "
                          "(llama.cpp only)"},
    )

    def __post_init__(self) -> None:
        if self.edit_format not in EDIT_FORMATS:
            raise ConfigError(
                f"unknown edit format {self.edit_format!r}", hint=f"known: {EDIT_FORMATS}"
            )
        if not 0.0 <= self.llm_share <= 1.0:
            raise ConfigError(f"llm_share must be in [0, 1], got {self.llm_share}")


@dataclass(frozen=True)
class Proposal:
    """A candidate child of the parent, or why there is none."""

    source: str | None
    origin: VariantOrigin  # LLM or RULE
    operator: str  # the transformation's name
    transformation: Transformation
    llm_call: LLMCall | None
    ok: bool
    reason: str | None  # why it failed (recorded as the variant's apply_failed reason)
    diff: str | None  # unified diff against the parent
    detail: str | None = None  # what a rule changed, or how the model's answer was applied


def unified_diff(parent: str, child: str, name: str = "kernel.cu") -> str:
    return "".join(
        difflib.unified_diff(
            parent.splitlines(keepends=True),
            child.splitlines(keepends=True),
            fromfile=f"parent/{name}",
            tofile=f"variant/{name}",
        )
    )


def declaration_problem(source: str) -> str | None:
    """Why the variant's ``// r3:`` declarations would stop the inner loop, or ``None``."""
    from r3tui.search.source import (
        DeclarationError,
        parse_exact,
        parse_first,
        parse_relations,
        parse_tunables,
    )

    try:
        parse_tunables(source)
        parse_relations(source)
        parse_exact(source)
        parse_first(source)
    except DeclarationError as exc:
        return f"its r3 declarations do not parse: {exc.one_line()}"
    return None


# What the prompt holds besides the source, in tokens, and how many characters of CUDA a token
# holds (measured with SmolLM2's and Qwen2.5-Coder's tokenizers on the examples: 2.9-3.4).
_PROMPT_TOKENS = 700
_CHARS_PER_TOKEN = 2.9


def view_chars(n_ctx: int, max_tokens: int) -> int:
    """How much of an application's device code fits a prompt beside the answer."""
    return max(1500, int((n_ctx - max_tokens - _PROMPT_TOKENS) * _CHARS_PER_TOKEN))


def answer_check(source: str, settings: MutatorSettings) -> AnswerCheck | None:
    """The checks a SEARCH/REPLACE answer's tokens pass while the model samples them: the
    names of ``source`` (:class:`IdentifierCheck`) and the sections' brackets
    (:class:`BalanceCheck`), as ``settings`` ask; None where they ask for neither."""
    checks: list[AnswerCheck] = []
    if settings.check_names:
        checks.append(IdentifierCheck.for_unit(source))
    if settings.check_balance:
        checks.append(BalanceCheck())
    if not checks:
        return None
    return checks[0] if len(checks) == 1 else Checks(checks)


def _kernel_text(ctx: MutationContext) -> str:
    """The kernel's definition in the parent: what a confined edit may search in."""
    parent = ctx.parent_source.replace("\r\n", "\n")
    span = find_kernel(parent, ctx.kernel_name)
    return ctx.parent_source if span is None else parent[span.start : span.body_end] + "\n"


def _offered(ctx: MutationContext) -> tuple[Transformation, ...]:
    """The catalogue less the changes the recorded launch rules out: exchanging the thread
    axes (:data:`~r3tui.remix.rules.SQUARE_WORK_RULES`) where the work is not square."""
    return tuple(t for t in CATALOGUE if ctx.square_work or t.rule not in SQUARE_WORK_RULES)


def _preferred(order: tuple[str, ...] | None,
               offered: tuple[Transformation, ...] = CATALOGUE) -> Transformation | None:
    """The first entry of ``offered`` in ``order`` (the campaign's bandit), if any."""
    names = {t.name: t for t in offered}
    return next((names[n] for n in order or () if n in names), None)


class Mutator:
    def __init__(self, backend: LLMBackend | None, settings: MutatorSettings | None = None):
        self.backend = backend
        self.settings = settings or MutatorSettings()
        self._lock = threading.Lock()

    def propose(self, ctx: MutationContext, rng: random.Random) -> Proposal:
        """One proposal: the model or a rule (see the module docstring for which)."""
        wanted = ctx.transformation
        if ctx.repair is not None:
            return self.propose_llm(ctx, rng)  # only the model repairs its own change
        if self.backend is None:
            return self.propose_rule(ctx, rng)
        if wanted is not None and wanted.rule is None:
            return self.propose_llm(ctx, rng)
        if rng.random() < self.settings.llm_share:
            return self.propose_llm(ctx, rng)
        proposal = self.propose_rule(ctx, rng)
        if not proposal.ok and wanted is None:
            return self.propose_llm(ctx, rng)  # no rule applies to this parent
        return proposal

    # ------------------------------------------------------------------------------------

    def propose_rule(self, ctx: MutationContext, rng: random.Random) -> Proposal:
        """The first mechanical transformation (in an order drawn from ``rng``) whose rule
        applies and gives a source the campaign does not have yet (``ctx.is_known``); or
        ``ctx.transformation``'s rule alone."""
        if ctx.transformation is not None:
            if ctx.transformation.rule is None:
                return self._failed(
                    ctx.transformation,
                    VariantOrigin.RULE,
                    f"{ctx.transformation.name} has no rule; it needs the model",
                )
            candidates = [ctx.transformation]
        elif ctx.preference is not None:
            rank = {name: k for k, name in enumerate(ctx.preference)}
            candidates = sorted(mechanical(), key=lambda t: rank.get(t.name, len(rank)))
        else:
            candidates = rng.sample(mechanical(), len(mechanical()))
        reasons = []
        for transformation in candidates:
            assert transformation.rule is not None
            if ctx.grid_fixed and transformation.rule in LAUNCH_RULES:
                reasons.append(f"{transformation.rule}: an application's host code sets the "
                               "launch (its grid, its shared memory), which r3 apply cannot "
                               "change")
                continue
            if transformation.rule in SQUARE_WORK_RULES and not ctx.square_work:
                reasons.append(f"{transformation.rule}: the recorded work is not as wide along x "
                               "as along y, so exchanging the axes would not cover it")
                continue
            if ctx.confined and transformation.rule in SHARED_MEMORY_RULES:
                reasons.append(f"{transformation.rule}: an application's host code sets the "
                               "launch's dynamic shared memory, which r3 apply cannot change")
                continue
            result = apply_rule(transformation.rule, ctx.parent_source, ctx.kernel_name, rng)
            if (result.ok and result.source is not None and ctx.is_known is not None
                    and ctx.is_known(result.source)):
                reasons.append(f"{transformation.rule}: gives a variant the campaign has")
                continue
            if result.ok and result.source is not None:
                return self._finish(
                    ctx, transformation, VariantOrigin.RULE, None, result.source, result.detail
                )
            reasons.append(f"{transformation.rule}: {result.reason}")
        return self._failed(
            candidates[0], VariantOrigin.RULE, "no rule applies (" + "; ".join(reasons) + ")"
        )

    def propose_llm(self, ctx: MutationContext, rng: random.Random) -> Proposal:
        """Ask the model for ``ctx.transformation`` (or one drawn from the catalogue)."""
        if self.backend is None:
            raise ConfigError("an LLM proposal needs a model", hint="pass --model or use rules")
        offered = _offered(ctx)
        transformation = (ctx.transformation or _preferred(ctx.preference, offered)
                          or rng.choice(offered))
        origin = VariantOrigin.REPAIR if ctx.repair is not None else VariantOrigin.LLM
        settings = self.settings
        sampling = settings.sampling
        if sampling.seed is None:
            sampling = dataclasses.replace(sampling, seed=rng.randrange(2**31))
        edit_format = ctx.edit_format or settings.edit_format
        grammar_name: str | None = None
        grammar: str | None = None
        if settings.use_grammar and edit_format == "search_replace" and settings.anchor_search:
            grammar_name, grammar = ANCHORED_GRAMMAR, anchored_search_grammar(
                _kernel_text(ctx) if ctx.confined else ctx.parent_source,
                None if transformation.signature else ctx.kernel_name,
                macros=transformation.macros and not ctx.confined)
        elif settings.use_grammar:
            grammar_name = GRAMMAR_FOR_FORMAT[edit_format]
            grammar = load_grammar(grammar_name)
        asked = dataclasses.replace(ctx, transformation=transformation, edit_format=edit_format)
        if ctx.confined:  # the kernel's view sized to the model's context, answer left out
            n_ctx = getattr(self.backend, "n_ctx", None) or 4096
            asked = dataclasses.replace(asked, view_chars=view_chars(n_ctx, sampling.max_tokens))
        check = answer_check(ctx.parent_source, settings) if edit_format == "search_replace" \
            else None
        try:
            completion = self._complete(asked, sampling, grammar, grammar_name, check)
        except PromptTooLong as exc:
            if not asked.inspirations:
                return self._failed(transformation, origin, exc.one_line())
            try:  # the inspirations are the part of the prompt that can go
                asked = dataclasses.replace(asked, inspirations=())
                completion = self._complete(asked, sampling, grammar, grammar_name, check)
            except PromptTooLong as again:
                return self._failed(transformation, origin, again.one_line())
        call = completion.call
        cut_off = completion.finish_reason == "length"
        if edit_format == "whole":
            parsed = parse_whole(completion.text)
        else:
            parsed = parse_search_replace(completion.text)
        if not parsed.ok:
            reason = parsed.reason or "the answer does not parse"
            if cut_off and "max_tokens" not in reason:
                reason += f" (the answer was cut off at {sampling.max_tokens} tokens)"
            return self._failed(transformation, origin, reason, call)
        applied: ApplyResult
        if parsed.source is not None:
            applied = apply_whole(ctx.parent_source, parsed.source, ctx.kernel_name)
            how = "whole kernel"
        else:
            applied = apply_edits(ctx.parent_source, parsed.edits, ctx.kernel_name, partial=True)
            n_ok = len(parsed.edits) - len(applied.skipped)
            how = (
                f"{n_ok} of {len(parsed.edits)} edit(s)" if applied.skipped
                else f"{len(parsed.edits)} edit(s)"
            ) + (", whitespace-tolerant" if applied.tolerant else "")
            how += "".join(f"; skipped {why}" for why in applied.skipped)
        if parsed.dropped:
            how += f"; left out: {parsed.dropped}"
        if not applied.ok or applied.source is None:
            reason = applied.reason or "the answer does not apply"
            if parsed.dropped:
                reason += f"; left out: {parsed.dropped}"
            return self._failed(transformation, origin, reason, call)
        return self._finish(ctx, transformation, origin, call, applied.source, how)

    # ------------------------------------------------------------------------------------

    def _complete(
        self,
        ctx: MutationContext,
        sampling: Sampling,
        grammar: str | None,
        grammar_name: str | None,
        check: AnswerCheck | None = None,
    ) -> Completion:
        assert self.backend is not None
        messages = build_messages(ctx)
        with self._lock:
            return self.backend.complete(
                messages, sampling=sampling, grammar=grammar, grammar_name=grammar_name,
                check=check,
            )

    def _finish(
        self,
        ctx: MutationContext,
        transformation: Transformation,
        origin: VariantOrigin,
        call: LLMCall | None,
        source: str,
        detail: str | None,
    ) -> Proposal:
        problem = declaration_problem(source)
        if problem is None and ctx.confined:
            problem = outside_kernel_problem(ctx.parent_source, source, ctx.kernel_name)
        if problem:
            return self._failed(transformation, origin, problem, call)
        return Proposal(
            source=source,
            origin=origin,
            operator=transformation.name,
            transformation=transformation,
            llm_call=call,
            ok=True,
            reason=None,
            diff=unified_diff(ctx.parent_source, source),
            detail=detail,
        )

    @staticmethod
    def _failed(
        transformation: Transformation,
        origin: VariantOrigin,
        reason: str,
        call: LLMCall | None = None,
    ) -> Proposal:
        return Proposal(
            source=None,
            origin=origin,
            operator=transformation.name,
            transformation=transformation,
            llm_call=call,
            ok=False,
            reason=reason,
            diff=None,
        )
