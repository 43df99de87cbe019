"""record layer of R³: the bundle format and the recorders.

Importing this package loads neither ``cuda.bindings.driver`` nor pycuda; :func:`capture`
imports pycuda when a capture starts.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from r3tui.record.pycuda_capture import CaptureSession


def capture(path: str | os.PathLike[str], *, kernels: Collection[str] | None = None,
            **kwargs: Any) -> AbstractContextManager[CaptureSession]:
    """``with r3tui.record.capture(path):`` records the PyCUDA launches inside the block."""
    from r3tui.record.pycuda_capture import capture as _capture

    return _capture(path, kernels=kernels, **kwargs)


__all__ = ["capture"]
