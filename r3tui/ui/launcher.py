"""Campaigns the TUI starts: the engine as a child process, steered by signals.

The UI must not import the engine (it would pull in the compiler, the replay worker, the
optimizer and the model), so a campaign started from the TUI is ``python -m r3tui tune ...``
in a child process that writes the same database the TUI reads.  The engine polls its flags
at batch boundaries (``r3tui.engine.control``): SIGUSR1 pauses, SIGUSR2 resumes, SIGTERM
stops; it records each change as a campaign status and an event, which the TUI shows like
any other write.  The child's output is drained by a thread, so a chatty engine never blocks
on a full pipe, and its last stderr line explains a failure.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from r3tui.errors import R3Error

PAUSE_SIGNAL = signal.SIGUSR1
RESUME_SIGNAL = signal.SIGUSR2
STOP_SIGNAL = signal.SIGTERM


class LaunchError(R3Error):
    """The engine could not be started, or a request reached no running engine."""


@dataclass(frozen=True)
class LaunchRequest:
    """What ``r3 tune`` is started with."""

    bundle: Path
    db: Path
    budget: str = "60"
    name: str = ""  # the TUI finds the campaign by this name; empty: derived from the bundle
    extra_args: tuple[str, ...] = ()  # e.g. ("--inner-only",) or ("--islands", "2")

    @property
    def campaign_name(self) -> str:
        return self.name or f"{self.bundle.stem}-tui-{time.strftime('%Y%m%d-%H%M%S')}"

    def argv(self, name: str, python: str = sys.executable) -> list[str]:
        return [
            python,
            "-m",
            "r3tui",
            "tune",
            str(self.bundle),
            "--db",
            str(self.db),
            "--budget",
            self.budget,
            "--name",
            name,
            *self.extra_args,
        ]


@dataclass
class _Output:
    """The child's last lines, filled by the drain threads."""

    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=50))
    stdout: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=50))


class CampaignProcess:
    """One engine child process that this TUI started and may pause, resume and stop."""

    def __init__(self, process: subprocess.Popen[bytes], name: str, argv: Sequence[str]) -> None:
        self.process = process
        self.name = name
        self.argv = list(argv)
        self.paused = False
        self._output = _Output()
        self._threads = [
            threading.Thread(
                target=_drain, args=(stream, lines), daemon=True, name=f"r3-engine-{what}"
            )
            for what, stream, lines in (
                ("stderr", process.stderr, self._output.stderr),
                ("stdout", process.stdout, self._output.stdout),
            )
            if stream is not None
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def start(cls, request: LaunchRequest, *, argv: Sequence[str] | None = None) -> CampaignProcess:
        """Start the engine (``argv`` replaces the ``r3 tune`` command line, for tests)."""
        name = request.campaign_name
        command = list(argv) if argv is not None else request.argv(name)
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                # Its own session: Ctrl-C in the TUI must not reach the engine, which the TUI
                # stops itself at a batch boundary.
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"},
            )
        except OSError as exc:
            raise LaunchError(f"cannot start the engine ({command[0]}): {exc.strerror}") from exc
        return cls(process, name, command)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def last_error_line(self) -> str | None:
        """The child's last non-empty stderr line (progress bars redraw with \\r)."""
        for line in reversed(self._output.stderr):
            text = line.rsplit("\r", 1)[-1].strip()
            if text:
                return text
        return None

    def failure(self) -> str | None:
        """One line about an engine that exited unsuccessfully; None while it runs or on 0."""
        code = self.process.poll()
        if code is None or code == 0:
            return None
        self.join_output(timeout=1.0)
        last = self.last_error_line() or "no output"
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        return f"campaign {self.name}: the engine ended with {how}: {last}"

    def _signal(self, signum: int, what: str) -> None:
        if not self.running:
            raise LaunchError(f"campaign {self.name} is not running (cannot {what} it)")
        os.kill(self.process.pid, signum)

    def pause(self) -> None:
        self._signal(PAUSE_SIGNAL, "pause")
        self.paused = True

    def resume(self) -> None:
        self._signal(RESUME_SIGNAL, "resume")
        self.paused = False

    def stop(self) -> None:
        self._signal(STOP_SIGNAL, "stop")

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def join_output(self, timeout: float = 1.0) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop the engine at its next batch boundary; kill it only past the grace time."""
        if self.running:
            self.stop()
            if self.wait(grace_s) is None:
                self.process.kill()
                self.wait(grace_s)
        self.join_output()


def _drain(stream: IO[bytes], lines: collections.deque[str]) -> None:
    for raw in iter(stream.readline, b""):
        lines.append(raw.decode(errors="replace").rstrip("\n"))
    stream.close()
