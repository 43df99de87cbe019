"""The compile cache: results by :func:`~r3tui.compile.base.cache_key`, in memory and on disk.

On disk each entry is one JSON file, ``<dir>/<key[:2]>/<key>.json``, with the cubin in base64
and its sha256, written to a temporary file in the same directory and moved into place with
``os.replace``: a reader sees the old entry or the new one, never half of one, even when the
writer is killed.  An entry that does not parse, names another key or whose cubin does not match
its checksum is ignored (a miss), never an error.  JSON rather than pickle, so a damaged or
foreign file cannot run code.

Only successful compiles are kept: a failure may come from a crash or a timeout that is not
the source's fault, and a failed variant is cheap to retry.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from r3tui.compile.base import CACHE_FORMAT, CompiledKernel, CompileRequest, Toolchain, cache_key
from r3tui.domain import ResourceUsage

log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """The per-user cache directory R³ uses when the config names none."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("r3tui")) / "compile"


class CompileCache:
    """Compiled kernels by cache key; ``directory=None`` keeps them in memory only."""

    def __init__(self, directory: Path | None = None, *, max_memory_entries: int = 4096) -> None:
        self.directory = Path(directory) if directory is not None else None
        self.max_memory_entries = max_memory_entries
        self._memory: OrderedDict[str, CompiledKernel] = OrderedDict()
        self._lock = threading.Lock()  # the pool fills the cache from its dispatcher thread
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> CompiledKernel | None:
        """The cached result for ``key`` (``cached=True``, ``seconds=0``), or ``None``."""
        with self._lock:
            found = self._memory.get(key)
            if found is not None:
                self._memory.move_to_end(key)
        if found is None and self.directory is not None:
            found = self._read(key)
            if found is not None:
                self._remember(found)
        if found is None:
            return None
        return dataclasses.replace(found, cached=True, seconds=0.0)

    def put(self, result: CompiledKernel) -> None:
        """Keep ``result`` if it is a successful compile with a key."""
        if not result.ok or result.binary is None or not result.cache_key:
            return
        stored = dataclasses.replace(result, cached=False)
        self._remember(stored)
        if self.directory is not None:
            self._write(stored)

    def compile(self, toolchain: Toolchain, req: CompileRequest) -> CompiledKernel:
        """``req`` from the cache, or compiled by ``toolchain`` and then cached."""
        hit = self.get(cache_key(toolchain, req))
        if hit is not None:
            return hit
        result = toolchain.compile(req)
        self.put(result)
        return result

    def __contains__(self, key: str) -> bool:
        with self._lock:
            if key in self._memory:
                return True
        return self.directory is not None and self._path(key).is_file()

    def _remember(self, result: CompiledKernel) -> None:
        with self._lock:
            self._memory[result.cache_key] = result
            self._memory.move_to_end(result.cache_key)
            while len(self._memory) > self.max_memory_entries:
                self._memory.popitem(last=False)

    def _path(self, key: str) -> Path:
        assert self.directory is not None
        return self.directory / key[:2] / f"{key}.json"

    def _write(self, result: CompiledKernel) -> None:
        path = self._path(result.cache_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(_to_json(result), sort_keys=True).encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _read(self, key: str) -> CompiledKernel | None:
        path = self._path(key)
        try:
            data = json.loads(path.read_bytes())
            result = _from_json(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable compile cache entry %s: %s", path, exc)
            return None
        if result.cache_key != key:
            log.warning("ignoring compile cache entry %s: it is for key %s", path, result.cache_key)
            return None
        return result


def _to_json(result: CompiledKernel) -> dict[str, Any]:
    data = dataclasses.asdict(result)
    binary = data.pop("binary")
    data["binary_b64"] = base64.b64encode(binary).decode("ascii")
    data["binary_file_sha256"] = hashlib.sha256(binary).hexdigest()
    data["format"] = CACHE_FORMAT
    return data


def _from_json(data: Any) -> CompiledKernel:
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    if data.get("format") != CACHE_FORMAT:
        raise ValueError(f"cache format {data.get('format')!r}, expected {CACHE_FORMAT}")
    binary = base64.b64decode(data["binary_b64"], validate=True)
    if hashlib.sha256(binary).hexdigest() != data["binary_file_sha256"]:
        raise ValueError("the cubin does not match its checksum")
    fields = {f.name for f in dataclasses.fields(CompiledKernel)}
    values = {k: v for k, v in data.items() if k in fields}
    values["binary"] = binary
    values["resources"] = ResourceUsage(**data["resources"])
    return CompiledKernel(**values)
