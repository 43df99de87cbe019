"""One error hierarchy for everything a user can cause.

The CLI catches :class:`R3Error`, prints ``r3: error: <message>`` on one line and exits 2.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class R3Error(Exception):
    """Base of every error a user can cause or fix."""

    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def one_line(self) -> str:
        text = " ".join(str(self).split())
        return f"{text} ({self.hint})" if self.hint else text


class ConfigError(R3Error):
    """A bad config file, option or environment variable."""


class DatabaseError(R3Error):
    """The experiment database cannot be opened or used."""


class DatabaseMissing(DatabaseError):
    """A read-only command was pointed at a database file that does not exist."""


class DatabaseCorrupt(DatabaseError):
    """The file is not an SQLite database, or SQLite reports it damaged."""


class SchemaTooNew(DatabaseError):
    """The database was written by a newer R³ whose schema this one does not know."""


class SchemaNeedsUpgrade(DatabaseError):
    """The database was written by an older R³ and a read-only open cannot migrate it."""


class DatabaseLocked(DatabaseError):
    """Another writer holds the database longer than the busy timeout."""


class RecordingError(R3Error):
    """A recording bundle is missing, malformed or fails its checksums."""


class ApplicationFaulted(RecordingError):
    """A kernel of the recorded application faulted.  The recording made before the fault is
    kept; exit 1, not 2: the program misbehaved under recording, R3's input was fine."""

    exit_code = 1


class ApplicationTimedOut(RecordingError):
    """The recorded application did not finish within ``r3 record --timeout``; it was killed.
    Exit 1: the program (or R3's interposer under it) hung, R3's input was fine."""

    exit_code = 1


class RecordingWriteFailed(RecordingError):
    """A recording's files could not be written (a full disk, a quota).  What was written
    before it is kept and registered; exit 1, like a fault: the recording is incomplete."""

    exit_code = 1


class ManifestError(RecordingError):
    """The bundle manifest does not validate."""


class ChecksumMismatch(RecordingError):
    """A blob's content does not match the sha256 the manifest names."""


class ArenaUnavailable(RecordingError):
    """The fixed virtual-address range for recorded allocations cannot be reserved."""


class ToolchainError(R3Error):
    """A compiler is missing or cannot run (not a compile error in the user's source)."""


class KernelNotFound(R3Error):
    """The named kernel is not in the source or the module."""


class GpuUnavailable(R3Error):
    """The command needs a CUDA GPU and none is usable here."""


class RetimeFailed(GpuUnavailable):
    """Re-timing stopped on an error a candidate's launch raised in a worker that still runs
    (not a lost or hung GPU): the caller may find which candidate and go on without it."""


class ModelError(R3Error):
    """No language model file was found, or it cannot be loaded."""
