"""Pause and stop requests for a running campaign.

A campaign started from the TUI runs as a child process (the UI never imports the engine), so
the requests arrive as signals: SIGUSR1 pauses, SIGUSR2 resumes, SIGTERM and SIGINT stop.  The
engine only looks at the flags at batch and variant boundaries: a kernel in flight on the GPU,
a compile or an LLM answer is always finished and stored before the campaign stops.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

PAUSE_SIGNAL = signal.SIGUSR1
RESUME_SIGNAL = signal.SIGUSR2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class CampaignControl:
    """Flags the engine polls; set from signal handlers or directly (tests, an embedding app)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._paused = threading.Event()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    @property
    def paused(self) -> bool:
        return self._paused.is_set()

    def request_stop(self) -> None:
        self._stop.set()

    def request_pause(self) -> None:
        self._paused.set()

    def request_resume(self) -> None:
        self._paused.clear()

    def wait_while_paused(
        self, on_pause: Callable[[], None], on_resume: Callable[[], None], poll_s: float = 0.2
    ) -> None:
        """Block while paused (unless a stop arrives), reporting both edges once."""
        if not self._paused.is_set() or self._stop.is_set():
            return
        on_pause()
        while self._paused.is_set() and not self._stop.is_set():
            time.sleep(poll_s)
        if not self._stop.is_set():
            on_resume()

    @contextmanager
    def signals(self) -> Iterator[CampaignControl]:
        """Route the pause/resume/stop signals to this control while the block runs.

        Only the main thread may install handlers; elsewhere (a test thread, an embedding
        application) the control still works through its methods.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return

        def on_stop(signum: int, frame: FrameType | None) -> None:
            if self._stop.is_set() and signum == signal.SIGINT:
                # a second Ctrl-C means "now": the DB is consistent after every commit
                raise KeyboardInterrupt
            self._stop.set()

        def on_pause(signum: int, frame: FrameType | None) -> None:
            self._paused.set()

        def on_resume(signum: int, frame: FrameType | None) -> None:
            self._paused.clear()

        handlers = {PAUSE_SIGNAL: on_pause, RESUME_SIGNAL: on_resume}
        handlers.update({s: on_stop for s in STOP_SIGNALS})
        previous = {s: signal.signal(s, h) for s, h in handlers.items()}
        try:
            yield self
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
