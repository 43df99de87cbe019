"""The LLM call that wrote a variant: model, tokens, latency, prompt and response."""

from __future__ import annotations

from rich.console import Group
from rich.rule import Rule
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from db.series import VariantDetail
from r3tui.domain import LLMCall


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
                Text(call.prompt),
                Rule("response", align="left"),
                Text(call.response),
            )
        )
        self.scroll_home(animate=False)
