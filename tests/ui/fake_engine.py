"""A fake engine for the launcher tests: the real one needs a GPU, which this machine lacks.

It speaks the same protocol as ``r3 tune``: it writes a campaign of the given name to the
database, adds a variant with trials at each "batch", and at batch boundaries honours
SIGUSR1 (pause: status paused + a pause event), SIGUSR2 (resume) and SIGTERM (stop: status
stopped + a stop event, exit 0).  ``--fail`` exits like a user error of ``r3 tune``.

    python tests/ui/fake_engine.py DB NAME [--fail] [--batches N]
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from db import repository as repo
from db.session import open_database
from r3tui.domain import CampaignStatus
from tests.ui.factories import CampaignSpec, add_campaign, add_live_variant

flags = {"pause": False, "stop": False}


def _pause(signum: int, frame: FrameType | None) -> None:
    flags["pause"] = True


def _resume(signum: int, frame: FrameType | None) -> None:
    flags["pause"] = False


def _stop(signum: int, frame: FrameType | None) -> None:
    flags["stop"] = True


def main(argv: list[str]) -> int:
    db_path, name = Path(argv[0]), argv[1]
    if "--fail" in argv:
        print("tuning: 0/60", file=sys.stderr)
        print(f"r3: error: no recording bundle at {db_path.parent}/missing.r3b", file=sys.stderr)
        return 2
    batches = int(argv[argv.index("--batches") + 1]) if "--batches" in argv else 1000
    signal.signal(signal.SIGUSR1, _pause)
    signal.signal(signal.SIGUSR2, _resume)
    signal.signal(signal.SIGTERM, _stop)
    db = open_database(db_path, create=True)
    with db.session_scope() as s:
        built = add_campaign(
            s, CampaignSpec(name=name, n_variants=3, n_trials=12, status=CampaignStatus.RUNNING)
        )
    parent = built.variant_ids[-1]
    for k in range(batches):
        if flags["stop"]:
            break
        if flags["pause"]:
            with db.session_scope() as s:
                repo.set_campaign_status(s, built.id, CampaignStatus.PAUSED)
                repo.add_event(s, built.id, "pause", "paused by request")
            while flags["pause"] and not flags["stop"]:
                time.sleep(0.05)
            if not flags["stop"]:
                with db.session_scope() as s:
                    repo.set_campaign_status(s, built.id, CampaignStatus.RUNNING)
                    repo.add_event(s, built.id, "resume", "resumed by request")
            continue
        add_live_variant(db, built.id, parent, k, time_s=90e-6 - k * 1e-7)
        time.sleep(0.1)
    with db.session_scope() as s:
        status = CampaignStatus.STOPPED if flags["stop"] else CampaignStatus.FINISHED
        repo.set_campaign_status(s, built.id, status, finished=True)
        repo.add_event(s, built.id, "stop" if flags["stop"] else "finish", f"{status.value}")
    db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
