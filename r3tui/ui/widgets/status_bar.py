"""One line under the campaign: state, throughput, where the time went, the GPU."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.widgets import Static

from db.browse import CampaignHeader
from db.figures import duration_text, evaluations_per_s, rate_text, workers_text
from db.series import CampaignStats
from r3tui.domain import CampaignStatus
from r3tui.ui.quantities import duration

# A campaign marked running that wrote nothing for this long has probably lost its engine
# (killed without a chance to mark itself crashed).
STALE_AFTER_S = 120.0

STATUS_STYLES = {
    CampaignStatus.RUNNING: "bold green",
    CampaignStatus.PAUSED: "bold yellow",
    CampaignStatus.FINISHED: "bold",
    CampaignStatus.STOPPED: "bold yellow",
    CampaignStatus.CRASHED: "bold red",
    CampaignStatus.FAILED: "bold red",
    CampaignStatus.CREATED: "dim",
}


def status_line(
    header: CampaignHeader,
    stats: CampaignStats,
    now: datetime,
    *,
    owned: str | None = None,
    tree_filter: str = "all",
) -> Text:
    line = Text()
    line.append(f" {header.status.value} ", style=f"reverse {STATUS_STYLES[header.status]}")
    last = max(filter(None, (stats.last_trial_at, header.updated_at)))
    took = header.timing.duration_s(now)  # the one definition: db.figures
    if header.status is CampaignStatus.RUNNING:
        quiet = (now - last).total_seconds()
        if owned is None and quiet > STALE_AFTER_S:
            line.append(f" no writes for {duration(quiet)}: engine gone?", style="red")
        else:
            line.append(f" {duration_text(took)}")
    elif took is not None:
        line.append(f" took {duration_text(took)}")
    if owned:
        line.append(f" [{owned}]", style="bold")
    rate = evaluations_per_s(stats.n_trials, took)
    line.append(f" │ {stats.n_trials} evals")
    if rate is not None:
        line.append(f" {rate_text(rate)}")
    total = stats.llm_s + stats.compile_s + stats.replay_s
    if total > 0:
        shares = (
            ("LLM", stats.llm_s),
            ("compile", stats.compile_s),
            ("replay", stats.replay_s),
        )
        line.append(" │ " + " ".join(f"{n} {100 * v / total:.0f}%" for n, v in shares))
    line.append(f" │ {header.gpu or 'GPU ?'}")
    load = workers_text(header.workers) if header.status is CampaignStatus.RUNNING else None
    if load:
        line.append(f" │ {load}")
    if tree_filter != "all":
        line.append(f" │ filter: {tree_filter}", style="bold")
    return line


class CampaignStatusBar(Static):
    pass
