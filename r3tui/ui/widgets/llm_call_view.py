"""The LLM call that wrote a variant: model, tokens, latency, prompt and response.

The engine stores a prompt as the JSON list of its chat messages (``{"role", "content"}``,
the same for every backend); it is shown as the conversation it is, each message under
its role.  A prompt that is not such a list is shown as it was stored.
"""

from __future__ import annotations

import json

from rich.console import Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from db.series import VariantDetail
from r3tui.domain import LLMCall


def conversation(prompt: str) -> list[tuple[str, str]] | None:
    """(role, text) of each message of a stored prompt; None if it is not a message list."""
    try:
        data = json.loads(prompt)
    except ValueError:
        return None
    if not isinstance(data, list) or not data:
        return None
    messages: list[tuple[str, str]] = []
    for m in data:
        if not isinstance(m, dict):
            return None
        role, content = m.get("role"), m.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            return None
        messages.append((role, content))
    return messages


def prompt_lines(prompt: str) -> list[RenderableType]:
    messages = conversation(prompt)
    if messages is None:
        return [Text(prompt)]
    out: list[RenderableType] = []
    for i, (role, content) in enumerate(messages):
        if i:
            out.append(Text())
        out.append(Text(role, style="bold underline"))
        out.append(Text(content.rstrip("\n")))
    return out


class LLMCallView(VerticalScroll):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.can_focus = True

    def compose(self) -> ComposeResult:
        yield Static(Text("choose a variant in the tree", style="dim"), classes="llm")

    def show(self, detail: VariantDetail | None, call: LLMCall | None) -> None:
        body = self.query_one(".llm", Static)
        if detail is None:
            body.update(Text("choose a variant in the tree", style="dim"))
            return
        if call is None:
            origin = detail.node.origin.value
            body.update(
                Text(
                    f"variant #{detail.node.id} was not written by a model ({origin})", style="dim"
                )
            )
            return
        facts = Table.grid(padding=(0, 2))
        facts.add_column(style="bold", no_wrap=True)
        facts.add_column()
        rate = call.tokens_out / call.latency_s if call.latency_s else 0.0
        facts.add_row("model", f"{call.model_path} ({call.backend})")
        facts.add_row("tokens", f"{call.tokens_in} in, {call.tokens_out} out ({rate:.1f} tok/s)")
        facts.add_row("latency", f"{call.latency_s:.1f} s")
        facts.add_row("sampling", ", ".join(f"{k}={v}" for k, v in call.sampling.items()))
        facts.add_row("seed", str(call.seed))
        # Text, never markup: prompts and code are full of square brackets.
        body.update(
            Group(
                facts,
                Rule("prompt", align="left"),
                *prompt_lines(call.prompt),
                Rule("response", align="left"),
                Text(call.response),
            )
        )
        self.scroll_home(animate=False)
