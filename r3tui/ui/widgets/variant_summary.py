"""The selected variant at a glance: lineage, outcome, features and best configuration."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from db.browse import FAILED_STATUSES
from db.series import VariantDetail
from r3tui.domain import Dim3
from r3tui.ui.quantities import kernel_time, ratio, speedup
from r3tui.ui.widgets.variant_tree import failure_style


def _block(block: Dim3 | None) -> str:
    return "recorded" if block is None else "×".join(map(str, block.as_tuple()))


class VariantSummary(Static):
    """A two-column table; empty until a variant is chosen."""

    def show(self, detail: VariantDetail | None, original_s: float | None) -> None:
        if detail is None:
            self.update(Text("choose a variant in the tree", style="dim"))
            return
        node = detail.node
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        failed = node.status in FAILED_STATUSES
        status = Text(node.status.value, style=failure_style(self.app.no_color) if failed else "")
        if node.status_reason:
            status.append(f" — {node.status_reason}")
        rows: list[tuple[str, str | Text]] = [
            ("variant", f"#{node.id} on island {node.island}"),
            ("parent", f"#{node.parent_id}" if node.parent_id is not None else "none (seed)"),
            ("origin", f"{node.origin.value}: {node.operator or '-'}"),
            ("status", status),
            ("best time", kernel_time(node.best_time_s)),
            ("speedup", f"{speedup(ratio(original_s, node.best_time_s))} vs the original"),
            ("trials", str(node.n_trials)),
            ("children", str(node.n_children)),
        ]
        # the bandit's order a proposal was asked with is bookkeeping for re-runs; a repair's
        # failure gets a row of its own
        shown = {k: v for k, v in (detail.features or {}).items()
                 if k not in ("preference", "repair", "example_names")}
        if shown:
            rows.append(("features", ", ".join(f"{k}={v}" for k, v in shown.items())))
        if (detail.features or {}).get("repair"):
            rows.append(("repairs", str(detail.features["repair"])[:200]))
        trial = detail.best_trial
        if trial is not None:
            c = trial.config
            lb = c.launch_bounds
            rows += [
                ("best trial", f"#{trial.id}"),
                ("toolchain", c.toolchain + (f" (pipeline {c.pipeline})" if c.pipeline else "")),
                ("options", " ".join(c.options) or "(none)"),
                ("block", _block(c.block)),
                ("launch bounds", "none" if lb is None else f"{lb[0]}, {lb[1]}"),
                ("tunables", ", ".join(f"{k}={v}" for k, v in c.tunables.items()) or "(none)"),
                ("registers", str(trial.measurement.resources.registers or "-")),
            ]
        if detail.llm_call_id is not None:
            rows.append(("LLM call", f"#{detail.llm_call_id} (tab LLM)"))
        for name, value in rows:
            table.add_row(name, value)
        self.update(table)
