"""Answers from a finished campaign's LLM calls, for ``r3 tune --replay-llm`` (no model).

Each request is answered with the next recorded response, in order.  The re-run is the same
search only while it asks the same questions: when a rendered prompt (or the grammar it is
constrained by) differs from the recorded one, or the re-run asks more questions than were
recorded, :class:`ReplayDiverged` says where, and the re-run stops instead of quietly becoming
a different search.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from r3tui.domain import LLMCall
from r3tui.errors import R3Error
from r3tui.remix.backends import (
    AnswerCheck,
    ChatMessage,
    Completion,
    Sampling,
    render_prompt,
)


class ReplayDiverged(R3Error):
    """A re-run from recorded LLM answers asked something the recorded campaign did not."""


def _first_difference(a: str, b: str) -> int:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return min(len(a), len(b))


class RecordedBackend:
    """Replays ``calls`` in order; thread-safe (one answer at a time)."""

    name = "recorded"

    def __init__(self, calls: Sequence[LLMCall]) -> None:
        self._calls = list(calls)
        self._next = 0
        self._lock = threading.Lock()

    @property
    def remaining(self) -> int:
        return len(self._calls) - self._next

    def complete(
        self,
        messages: Sequence[ChatMessage],
        *,
        sampling: Sampling,
        grammar: str | None = None,
        grammar_name: str | None = None,
        check: AnswerCheck | None = None,  # not run: the answers are recorded
    ) -> Completion:
        prompt = render_prompt(messages)
        with self._lock:
            index = self._next
            if index >= len(self._calls):
                raise ReplayDiverged(
                    f"the re-run asks for LLM call {index + 1} but the campaign recorded "
                    f"only {len(self._calls)}"
                )
            recorded = self._calls[index]
            if recorded.prompt != prompt:
                at = _first_difference(recorded.prompt, prompt)
                excerpt = " ".join(prompt[max(0, at - 20) : at + 40].split())
                raise ReplayDiverged(
                    f"LLM call {index + 1}: the prompt differs from the recorded one at "
                    f"character {at} (...{excerpt}...)",
                    hint="the parent, its profile or the transformation chosen is not the same",
                )
            recorded_grammar = recorded.sampling.get("grammar")
            if recorded_grammar != grammar_name:
                raise ReplayDiverged(
                    f"LLM call {index + 1}: the recorded answer was constrained by grammar "
                    f"{recorded_grammar!r}, the re-run asks for {grammar_name!r}"
                )
            self._next += 1
        # The recorded call as it is (latency included): a report on the re-run describes the
        # original search, and the re-run's tree links the same calls.
        return Completion(text=recorded.response, call=recorded, finish_reason="recorded")

    def close(self) -> None:
        """Nothing to release."""
