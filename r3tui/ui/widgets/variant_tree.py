"""The evolutionary tree of a campaign's variants, loaded one page of children at a time.

The tree never reads the database: it asks its screen for pages (``ChildrenWanted``) when a
node is expanded or a "more" line is chosen, and the screen answers through ``add_page``.
A node with a thousand children shows the first page and a "more" line, so even a
campaign of 10,000 variants costs only the lines on screen.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from db.browse import FAILED_STATUSES, ChildPage, TreeChanges, VariantNode
from r3tui.domain import VariantStatus
from r3tui.ui.quantities import kernel_time, ratio, speedup

# A glyph per status so that the tree reads the same without colour (NO_COLOR, monochrome).
GLYPHS = {
    VariantStatus.IMPROVED: "▲",
    VariantStatus.VERIFIED: "●",
    VariantStatus.PENDING: "…",
}
STYLES = {
    VariantStatus.IMPROVED: "bold green",
    VariantStatus.VERIFIED: "",
    VariantStatus.PENDING: "yellow",
}
SHORT_REASON = {
    VariantStatus.APPLY_FAILED: "apply",
    VariantStatus.COMPILE_FAILED: "compile",
    VariantStatus.WRONG_RESULT: "wrong",
    VariantStatus.CRASHED: "crash",
    VariantStatus.UNSAFE: "unsafe",
}


@dataclass
class TreeItem:
    """What a tree line stands for: a variant, or the rest of a parent's children."""

    node: VariantNode | None  # None on a "more" line
    parent_id: int | None
    after_id: int = 0  # a "more" line: load children with ids above this
    remaining: int = 0
    loaded: bool = False  # a variant whose first page of children is in the tree
    loading: bool = False

    @property
    def is_more(self) -> bool:
        return self.node is None


def failure_style(monochrome: bool) -> str:
    """How a failure is drawn.  Under NO_COLOR Textual turns every colour into the grey of
    its luminance, and red becomes a grey next to the background: failures keep the normal
    foreground there and are told apart by italics (and the tree's ✗)."""
    return "italic" if monochrome else "red"


def variant_label(node: VariantNode, original_s: float | None, *, monochrome: bool = False) -> Text:
    failed = node.status in FAILED_STATUSES
    glyph = "✗" if failed else GLYPHS.get(node.status, "?")
    style = failure_style(monochrome) if failed else STYLES.get(node.status, "")
    label = Text(f"{glyph} #{node.id} ", style=style)
    label.append(f"{node.origin.value} {node.operator or '-'}", style=style)
    if node.best_time_s is not None:
        label.append(f" {kernel_time(node.best_time_s).replace(' ', '')}")
        label.append(f" {speedup(ratio(original_s, node.best_time_s))}", style=style or "bold")
    elif failed:
        reason = SHORT_REASON.get(node.status, node.status.value)
        if node.status_reason:
            reason = f"{reason}: {node.status_reason}"
        # not dim under NO_COLOR: dimmed grey on grey is what made failures unreadable
        label.append(f" {reason[:40]}", style=style if monochrome else "dim")
    if node.n_children:
        label.append(f" [{node.n_children}]", style="dim")
    return label


def _more_label(remaining: int) -> Text:
    return Text(f"… {remaining:,} more — enter loads them", style="dim italic")


class VariantTree(Tree[TreeItem]):
    """Textual's Tree with lazy pages, live additions and jumps to any variant."""

    BINDINGS: ClassVar[list[BindingType]] = [
        # in the help; the footer keeps its 80 columns for the screen's keys
        Binding("p", "cursor_parent", "Parent", show=False),
        Binding("c", "first_child", "Children", show=False),
    ]

    class ChildrenWanted(Message):
        def __init__(self, parent_id: int | None, after_id: int) -> None:
            super().__init__()
            self.parent_id = parent_id
            self.after_id = after_id

    class VariantChosen(Message):
        """The cursor is on a variant (after a move, a jump or a reload)."""

        def __init__(self, variant_id: int) -> None:
            super().__init__()
            self.variant_id = variant_id

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("variants", id=id)
        self.show_root = False
        self.guide_depth = 2
        self.auto_expand = False
        self.original_s: float | None = None
        self.generation = 0  # bumped by reset: answers for an older tree are dropped
        self._by_id: dict[int, TreeNode[TreeItem]] = {}
        self._pending_target: int | None = None
        self._first_child_of: int | None = None  # "c" pressed before the children arrived
        self.islands_seen: set[int] = set()  # of variants that arrived live

    # ---------------------------------------------------------------- building the tree

    def clear_variants(self) -> None:
        """Empty the tree before loading it again (another filter, another campaign)."""
        self.reset("variants", TreeItem(None, None, loading=True))
        self._by_id.clear()
        self._pending_target = None
        self._first_child_of = None
        self.generation += 1

    @property
    def loaded_ids(self) -> list[int]:
        return list(self._by_id)

    def pending_ids(self) -> list[int]:
        """Shown variants whose status may still change without a new trial."""
        return [
            vid
            for vid, n in self._by_id.items()
            if n.data is not None
            and n.data.node is not None
            and n.data.node.status is VariantStatus.PENDING
        ]

    def has_variant(self, variant_id: int) -> bool:
        return variant_id in self._by_id

    def _label(self, node: VariantNode) -> Text:
        return variant_label(node, self.original_s, monochrome=self.app.no_color)

    def _parent_line(self, parent_id: int | None) -> TreeNode[TreeItem] | None:
        return self.root if parent_id is None else self._by_id.get(parent_id)

    def _add_variant(
        self,
        parent: TreeNode[TreeItem],
        node: VariantNode,
        *,
        before: TreeNode[TreeItem] | None = None,
    ) -> TreeNode[TreeItem]:
        # A variant without children has nothing to load: it counts as loaded, so children
        # that arrive live are added under it instead of only being counted.
        line = parent.add(
            self._label(node),
            TreeItem(node, node.parent_id, loaded=node.n_children == 0),
            allow_expand=node.n_children > 0,
            before=before,
        )
        self._by_id[node.id] = line
        return line

    def _more_line(self, parent: TreeNode[TreeItem]) -> TreeNode[TreeItem] | None:
        for child in parent.children:
            if child.data is not None and child.data.is_more:
                return child
        return None

    def add_page(self, page: ChildPage) -> None:
        """Put one page of children under its parent (and a "more" line if any remain)."""
        parent = self._parent_line(page.parent_id)
        if parent is None or parent.data is None:
            return
        more = self._more_line(parent)
        if more is not None:
            more.remove()
        for child in list(parent.children):
            if child.data is None:  # the "loading" placeholder
                child.remove()
        for node in page.nodes:
            if node.id not in self._by_id:
                self._add_variant(parent, node)
        parent.data.loaded = True
        parent.data.loading = False
        if page.remaining:
            last = page.nodes[-1].id if page.nodes else 0
            parent.add_leaf(
                _more_label(page.remaining),
                TreeItem(None, page.parent_id, after_id=last, remaining=page.remaining),
            )
        if parent is not self.root and not parent.is_expanded:
            parent.expand()
        if self._pending_target is not None and self._pending_target in self._by_id:
            self.reveal(self._pending_target)
        if page.parent_id is not None and page.parent_id == self._first_child_of:
            self._first_child_of = None
            if page.nodes:
                self.reveal(page.nodes[0].id)

    def add_path(self, pages: list[ChildPage], target_id: int) -> None:
        """Load the pages down to ``target_id`` and move the cursor there."""
        for page in pages:
            parent = self._parent_line(page.parent_id)
            if parent is not None and parent.data is not None and not parent.data.loaded:
                self.add_page(page)
            elif parent is not None:
                # already loaded, but maybe not as far as this page goes: add what is missing
                more = self._more_line(parent)
                for node in page.nodes:
                    if node.id not in self._by_id:
                        self._add_variant(parent, node, before=more)
                if more is not None and more.data is not None and page.nodes:
                    more.data.after_id = max(more.data.after_id, page.nodes[-1].id)
            if parent is not None and parent is not self.root:
                parent.expand()
        self.reveal(target_id)

    def reveal(self, variant_id: int) -> bool:
        line = self._by_id.get(variant_id)
        if line is None:
            self._pending_target = variant_id
            return False
        self._pending_target = None
        ancestor = line.parent
        while ancestor is not None and ancestor is not self.root:
            ancestor.expand()
            ancestor = ancestor.parent
        # line numbers are rebuilt on the next refresh: move once they are
        self.call_after_refresh(self._land_on, line)
        return True

    def _land_on(self, line: TreeNode[TreeItem]) -> None:
        self.move_cursor(line)
        self.scroll_to_node(line, animate=False)

    def apply_changes(self, changes: TreeChanges) -> int:
        """New variants under loaded parents, fresh labels for changed ones; returns how
        many lines were added."""
        added = 0
        for node in changes.changed:
            self._relabel(node)
        for node in changes.new_nodes:
            self.islands_seen.add(node.island)
            if node.id in self._by_id:
                self._relabel(node)
                continue
            parent = self._parent_line(node.parent_id)
            if parent is None or parent.data is None:
                continue
            if parent is self.root or parent.data.loaded:
                more = self._more_line(parent)
                if more is not None and more.data is not None:
                    more.data.remaining += 1
                    more.set_label(
                        Text(
                            f"… {more.data.remaining:,} more — enter loads them", style="dim italic"
                        )
                    )
                else:
                    self._add_variant(parent, node)
                    added += 1
            self._count_child(parent)
            if parent is not self.root and parent.parent is self.root and not parent.is_expanded:
                parent.expand()  # a root (a seed) grows in sight while the campaign runs
        return added

    def _count_child(self, parent: TreeNode[TreeItem]) -> None:
        if parent is self.root or parent.data is None or parent.data.node is None:
            return
        node = parent.data.node
        parent.data.node = replace(node, n_children=node.n_children + 1)
        parent.allow_expand = True
        parent.set_label(self._label(parent.data.node))

    def _relabel(self, node: VariantNode) -> None:
        line = self._by_id.get(node.id)
        if line is None or line.data is None or line.data.node is None:
            return
        shown = line.data.node
        # the page's child count is kept: live additions already counted into it
        node = replace(node, n_children=max(node.n_children, shown.n_children))
        if node != shown:
            line.data.node = node
            line.allow_expand = node.n_children > 0
            line.set_label(self._label(node))

    def relabel_all(self) -> None:
        for line in self._by_id.values():
            if line.data is not None and line.data.node is not None:
                line.set_label(self._label(line.data.node))

    # ----------------------------------------------------------------------- reacting

    @property
    def cursor_variant(self) -> VariantNode | None:
        line = self.cursor_node
        if line is None or line.data is None:
            return None
        return line.data.node

    def _on_tree_node_expanded(self, event: Tree.NodeExpanded[TreeItem]) -> None:
        item = event.node.data
        if item is None or item.node is None or item.loaded or item.loading:
            return
        item.loading = True
        event.node.add_leaf(Text("loading…", style="dim italic"), None)
        self.post_message(self.ChildrenWanted(item.node.id, 0))

    def _on_tree_node_selected(self, event: Tree.NodeSelected[TreeItem]) -> None:
        item = event.node.data
        if item is not None and item.is_more and not item.loading:
            item.loading = True
            event.node.set_label(Text("loading…", style="dim italic"))
            self.post_message(self.ChildrenWanted(item.parent_id, item.after_id))
        elif item is not None and item.node is not None:
            event.node.toggle()

    def _on_tree_node_highlighted(self, event: Tree.NodeHighlighted[TreeItem]) -> None:
        item = event.node.data
        if item is not None and item.node is not None:
            self.post_message(self.VariantChosen(item.node.id))

    def action_first_child(self) -> None:
        line = self.cursor_node
        if line is None or line.data is None or line.data.node is None:
            return
        if not line.is_expanded:
            line.expand()
        if line.children and line.children[0].data is not None:
            self.call_after_refresh(self._land_on, line.children[0])
        elif line.data.node.n_children:
            self._first_child_of = line.data.node.id
