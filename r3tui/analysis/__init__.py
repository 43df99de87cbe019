"""Source analysis of CUDA C++ on a real parser (tree-sitter): facts, and the checks on them.

A low layer: it imports nothing else from r3tui, and nothing in the TUI imports it.
"""

from r3tui.analysis.cuda import (
    Call,
    ExecutionSpace,
    Include,
    InlineAsm,
    Item,
    ItemKind,
    Macro,
    MemorySpace,
    ParseError,
    TranslationUnit,
    Variable,
    parse_translation_unit,
)
from r3tui.analysis.safety import Finding, FindingKind, SafetyReport, check_candidate

__all__ = [
    "Call",
    "ExecutionSpace",
    "Finding",
    "FindingKind",
    "Include",
    "InlineAsm",
    "Item",
    "ItemKind",
    "Macro",
    "MemorySpace",
    "ParseError",
    "SafetyReport",
    "TranslationUnit",
    "Variable",
    "check_candidate",
    "parse_translation_unit",
]
