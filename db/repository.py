"""Every query R³ runs against the experiment database, gathered in one namespace.

The queries live in one module per table (``db.recordings``, ``db.campaigns``,
``db.variants``, ``db.trials``, ``db.llm_calls``, ``db.elites``, ``db.events``); callers
import them from here (``from db import repository as repo``), so where a query lives can
change without touching them.  What spans every table (row counts, the data version used
for polling) is defined here.

Functions take a ``Session`` first (from ``Database.session_scope()``), speak the domain
types of ``r3tui.domain`` where one exists, and return plain frozen values, never ORM rows:
callers cannot trigger lazy loads or hold rows past their session.  Lists the TUI shows
(summaries, trees, series) are single aggregate queries, not one query per row.

``get_*`` functions return None for an unknown id; updates of an unknown id raise
``KeyError`` (a caller bug, not something a user can cause).
"""

from __future__ import annotations

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from db.campaigns import (
    CampaignSummary,
    create_campaign,
    get_campaign,
    gpu_name,
    list_campaign_summaries,
    set_campaign_provenance,
    set_campaign_status,
    set_campaign_workers,
)
from db.elites import elites, upsert_elite
from db.events import EventRecord, add_event, events
from db.llm_calls import add_llm_call, campaign_llm_calls, get_llm_call
from db.models import Base
from db.recordings import (
    add_recording,
    bundle_location,
    find_recording_by_sha,
    get_recording,
    get_recording_manifest,
    list_recordings,
    stored_bundle_path,
)
from db.trials import (
    NewTrial,
    TrialRecord,
    best_so_far_series,
    finished_trials,
    get_trial,
    insert_trial,
    insert_trials,
    measured_before_call,
    trial_count,
    trial_values,
    trials_of_variant,
)
from db.variants import (
    TreeNode,
    add_variant,
    best_trial_id,
    campaign_tree,
    campaign_variants,
    children,
    get_variant,
    operator_outcomes,
    update_variant,
    variant_sources_after,
)

__all__ = [
    "CampaignSummary",
    "EventRecord",
    "NewTrial",
    "TreeNode",
    "TrialRecord",
    "add_event",
    "add_llm_call",
    "add_recording",
    "add_variant",
    "best_so_far_series",
    "best_trial_id",
    "bundle_location",
    "campaign_llm_calls",
    "campaign_tree",
    "campaign_variants",
    "children",
    "create_campaign",
    "data_version",
    "elites",
    "events",
    "find_recording_by_sha",
    "finished_trials",
    "get_campaign",
    "get_llm_call",
    "get_recording",
    "get_recording_manifest",
    "get_trial",
    "get_variant",
    "gpu_name",
    "insert_trial",
    "insert_trials",
    "list_campaign_summaries",
    "list_recordings",
    "measured_before_call",
    "operator_outcomes",
    "set_campaign_provenance",
    "set_campaign_status",
    "set_campaign_workers",
    "stored_bundle_path",
    "table_counts",
    "trial_count",
    "trials_of_variant",
    "update_variant",
    "upsert_elite",
    "variant_sources_after",
]

# The test factories (tests/ui/factories.py) build trial rows in bulk, with times of their
# choosing, from the same mapping insert_trials uses; they reach it under this old name.
_trial_values = trial_values


def table_counts(s: Session) -> dict[str, int]:
    """Rows per R³ table, for ``r3 db info``; tables an older schema lacks are left out."""
    present = set(s.execute(text("SELECT name FROM sqlite_master WHERE type = 'table'")).scalars())
    counts: dict[str, int] = {}
    for table in Base.metadata.sorted_tables:
        if table.name in present:
            counts[table.name] = int(
                s.execute(select(func.count()).select_from(table)).scalar_one()
            )
    return counts


def data_version(s: Session) -> int:
    """``PRAGMA data_version`` of the session's connection.

    It changes when *another* connection commits, and only compares with earlier values
    from the same connection; ``Database.data_version()`` keeps one connection for that.
    """
    return int(s.execute(text("PRAGMA data_version")).scalar_one())
