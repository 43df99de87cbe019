"""Messages that carry database results from worker threads to the widgets.

Workers never touch widgets: each query result comes back as one of these, posted to the
screen that asked, and handled on the UI thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual.message import Message

from db.browse import CampaignHeader, CampaignListRow, ChildPage, TreeChanges
from db.repository import EventRecord
from db.series import CampaignStats, Convergence, TrialPage, VariantDetail
from r3tui.domain import EliteCell, LLMCall
from r3tui.ui.opening import BrowseTarget


class DatabaseOpened(Message):
    def __init__(self, target: BrowseTarget) -> None:
        super().__init__()
        self.target = target


class DatabaseFailed(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class CampaignsLoaded(Message):
    def __init__(self, rows: list[CampaignListRow]) -> None:
        super().__init__()
        self.rows = rows


class HeaderLoaded(Message):
    def __init__(self, header: CampaignHeader) -> None:
        super().__init__()
        self.header = header


class ChildrenLoaded(Message):
    """One page of children; ``generation`` drops pages of a tree that was reset since."""

    def __init__(self, page: ChildPage, generation: int, after_id: int) -> None:
        super().__init__()
        self.page = page
        self.generation = generation
        self.after_id = after_id


class PathLoaded(Message):
    """The pages that lead from a root down to ``target_id`` (jump to best / to elite)."""

    def __init__(self, pages: list[ChildPage], target_id: int, generation: int) -> None:
        super().__init__()
        self.pages = pages
        self.target_id = target_id
        self.generation = generation


class TreeChanged(Message):
    def __init__(self, changes: TreeChanges, generation: int) -> None:
        super().__init__()
        self.changes = changes
        self.generation = generation


class VariantLoaded(Message):
    def __init__(self, detail: VariantDetail, llm_call: LLMCall | None) -> None:
        super().__init__()
        self.detail = detail
        self.llm_call = llm_call


class TrialsLoaded(Message):
    def __init__(self, page: TrialPage) -> None:
        super().__init__()
        self.page = page


@dataclass(frozen=True)
class CampaignLive:
    """The parts of a campaign that change while it runs, loaded together per poll."""

    header: CampaignHeader
    stats: CampaignStats
    convergence: Convergence
    elites: list[EliteCell]
    events: list[EventRecord]


class CampaignRefreshed(Message):
    def __init__(self, live: CampaignLive) -> None:
        super().__init__()
        self.live = live


class ExportFinished(Message):
    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
