"""How a campaign's status follows one run of it, the same for every kind of run.

A remix campaign (``r3 tune``), an inner-only search (``r3 tune --inner-only``) and a
re-run from recorded answers (``r3 tune --replay-llm``) each mark their campaign running,
then end it one of three ways:

- an original that cannot be searched (it does not compile, or does not replay to its
  epilogue: :class:`~r3tui.engine.unit_source.OriginalUnusable`): ``failed``, with an
  ``abort`` event holding the one line the user saw;
- anything else raised, a Ctrl-C that got through included: ``crashed``, with a ``crash``
  event naming the exception (the row is never left ``running``);
- the run's own end (:func:`finish`): ``finished``, ``stopped`` or ``paused``, with a
  ``finish`` or ``stop`` event that carries the run's timing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from r3tui.engine.unit_source import OriginalUnusable

if TYPE_CHECKING:
    from db.session import Database
    from r3tui.domain import CampaignStatus


@contextmanager
def campaign_run(database: Database, campaign_id: int) -> Iterator[None]:
    """The campaign's status if the run inside raises: failed or crashed (module doc)."""
    try:
        yield
    except OriginalUnusable as exc:
        fail(database, campaign_id, exc)
        raise
    except BaseException as exc:
        from db import repository as repo
        from r3tui.domain import CampaignStatus

        with database.session_scope() as s:
            repo.set_campaign_status(s, campaign_id, CampaignStatus.CRASHED)
            repo.add_event(s, campaign_id, "crash", f"{type(exc).__name__}: {exc}"[:500])
        raise


def fail(database: Database, campaign_id: int, exc: OriginalUnusable) -> None:
    """Mark the campaign failed: its original cannot be compiled or replayed."""
    from db import repository as repo
    from r3tui.domain import CampaignStatus

    with database.session_scope() as s:
        repo.set_campaign_status(s, campaign_id, CampaignStatus.FAILED, finished=True)
        repo.add_event(s, campaign_id, "abort", exc.one_line()[:500])


def finish(database: Database, campaign_id: int, status: CampaignStatus, message: str,
           timing: dict[str, Any] | None = None) -> None:
    """The run's own end: ``status`` (paused keeps the campaign open), and a ``stop`` event
    for a stopped run, else ``finish``, carrying ``timing``."""
    from db import repository as repo
    from r3tui.domain import CampaignStatus

    with database.session_scope() as s:
        repo.set_campaign_status(s, campaign_id, status,
                                 finished=status is not CampaignStatus.PAUSED)
        repo.add_event(s, campaign_id,
                       "stop" if status is CampaignStatus.STOPPED else "finish", message, timing)
