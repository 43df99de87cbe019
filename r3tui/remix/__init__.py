"""The remix layer of R³: language-model backends, prompts, answer parsing and rule operators.

- :mod:`~r3tui.remix.backends`: :class:`LLMBackend`, :class:`ChatMessage`, :class:`Sampling`,
  :class:`Completion`, :func:`open_backend`; llama.cpp in-process
  (:mod:`~r3tui.remix.llama_cpp_backend`), an OpenAI-compatible server
  (:mod:`~r3tui.remix.http_backend`), recorded answers (:mod:`~r3tui.remix.recorded`).
- :mod:`~r3tui.remix.catalogue`: the named transformations and their families.
- :mod:`~r3tui.remix.prompt`: the prompt from the parent, its profile and inspirations.
- :mod:`~r3tui.remix.edits`: SEARCH/REPLACE and whole-kernel answers, applied to the parent.
- :mod:`~r3tui.remix.rules`: deterministic source operators.
- :mod:`~r3tui.remix.mutation`: :class:`Mutator`, one :class:`Proposal` per call.

Importing this package loads no model and no ``llama_cpp``.
"""

from r3tui.remix.backends import (
    BackendError,
    BackendSpec,
    ChatMessage,
    Completion,
    LLMBackend,
    PromptTooLong,
    Sampling,
    open_backend,
    parse_prompt,
    render_prompt,
)
from r3tui.remix.catalogue import CATALOGUE, FAMILIES, Transformation, mechanical, transformation
from r3tui.remix.edits import (
    ApplyResult,
    Edit,
    ParsedAnswer,
    apply_edits,
    apply_whole,
    entry_point_problem,
    find_kernel,
    parse_search_replace,
    parse_whole,
)
from r3tui.remix.models import ModelLocation, model_sha256, resolve_model
from r3tui.remix.mutation import (
    ANCHORED_GRAMMAR,
    GRAMMAR_FOR_FORMAT,
    Mutator,
    MutatorSettings,
    Proposal,
    anchored_search_grammar,
    load_grammar,
    unified_diff,
)
from r3tui.remix.prompt import Inspiration, MutationContext, VariantProfile, build_messages
from r3tui.remix.recorded import RecordedBackend, ReplayDiverged
from r3tui.remix.rules import RULES, RuleResult, apply_rule

__all__ = [
    "ANCHORED_GRAMMAR",
    "CATALOGUE",
    "FAMILIES",
    "GRAMMAR_FOR_FORMAT",
    "RULES",
    "ApplyResult",
    "BackendError",
    "BackendSpec",
    "ChatMessage",
    "Completion",
    "Edit",
    "Inspiration",
    "LLMBackend",
    "ModelLocation",
    "MutationContext",
    "Mutator",
    "MutatorSettings",
    "ParsedAnswer",
    "PromptTooLong",
    "Proposal",
    "RecordedBackend",
    "ReplayDiverged",
    "RuleResult",
    "Sampling",
    "Transformation",
    "VariantProfile",
    "anchored_search_grammar",
    "apply_edits",
    "apply_rule",
    "apply_whole",
    "build_messages",
    "entry_point_problem",
    "find_kernel",
    "load_grammar",
    "mechanical",
    "model_sha256",
    "open_backend",
    "parse_prompt",
    "parse_search_replace",
    "parse_whole",
    "render_prompt",
    "resolve_model",
    "transformation",
    "unified_diff",
]
