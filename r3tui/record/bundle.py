"""Recording bundles on disk: ``manifest.json`` plus content-addressed ``blobs/<sha256>``.

A bundle is written into a hidden temporary directory beside its destination, every file
fsynced, the manifest last, and only then renamed into place: a killed recorder leaves at
most a ``.<name>.tmp-*`` directory, never a directory that opens as a bundle.  Blobs are
named by the sha256 of their uncompressed content; ``<sha>.zlib`` is the zlib-compressed
form of the same content.  Identical contents (the prologue and epilogue of a read-only
buffer) are stored once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import zlib
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from r3tui.errors import ChecksumMismatch, ManifestError, RecordingError
from r3tui.record.manifest import Manifest, SourceFile, blob_users, canonical_json

MANIFEST_NAME = "manifest.json"
BLOB_DIR = "blobs"
_ZLIB_SUFFIX = ".zlib"
# Compress only when a sample of the content shrinks by at least this much: random floats
# do not compress, and trying costs ~10 ms per MB.
_COMPRESS_SAMPLE = 1 << 20
_COMPRESS_GAIN = 0.85
# zlib's fastest level: on 64 MiB of small int32 values (this machine, 2026-12-04) level 1
# wrote 147 MB/s for a ratio of 0.26, level 6 24 MB/s for 0.20; nw's recording (two 256 MiB
# int matrices per snapshot) spent 52 s of a 2 s program writing bundles at level 6.
_COMPRESS_LEVEL = 1


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class BundleWriter:
    """Writes one bundle atomically; use as a context manager or call :meth:`abort`.

    ``compress``: ``"zlib"`` (compress blobs that shrink) or ``None`` (store raw).
    """

    def __init__(self, path: str | os.PathLike[str], *, compress: str | None = "zlib",
                 overwrite: bool = False) -> None:
        if compress not in (None, "zlib"):
            raise ValueError(f"unknown blob compression {compress!r}")
        self.path = Path(path).absolute()
        if self.path.exists() and not overwrite:
            raise RecordingError(f"{self.path} already exists; choose another --out")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.overwrite = overwrite
        self.compress = compress
        self.tmp = self.path.parent / f".{self.path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        (self.tmp / BLOB_DIR).mkdir(parents=True)
        self.blobs: dict[str, int] = {}
        self._done = False

    def add_blob(self, data: bytes | bytearray | memoryview) -> str:
        """Store ``data`` (once per distinct content) and return its sha256."""
        view = memoryview(data).cast("B")
        sha = hashlib.sha256(view).hexdigest()
        if sha in self.blobs:
            return sha
        target = self.tmp / BLOB_DIR / sha
        payload: bytes | memoryview = view
        if self.compress == "zlib" and len(view) >= 4096:
            sample = bytes(view[:_COMPRESS_SAMPLE])
            if len(zlib.compress(sample, 1)) < _COMPRESS_GAIN * len(sample):
                payload = zlib.compress(view, _COMPRESS_LEVEL)
                target = target.with_name(sha + _ZLIB_SUFFIX)
        with open(target, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        self.blobs[sha] = len(view)
        return sha

    def commit(self, manifest: Manifest) -> Bundle:
        """Write the manifest and move the bundle into place."""
        if self._done:
            raise RuntimeError("bundle already committed or aborted")
        missing = [s for s in manifest.blobs if s not in self.blobs]
        if missing:
            raise ValueError(f"manifest names blobs that were never added: {missing[:3]}")
        # Round-trip through the validator: a writer bug must not produce a bundle that
        # only fails when someone opens it months later.
        text = json.dumps(manifest.to_json(), indent=2, sort_keys=True)
        Manifest.from_json(json.loads(text))
        _write_file(self.tmp / MANIFEST_NAME, text.encode() + b"\n")
        _fsync_dir(self.tmp / BLOB_DIR)
        _fsync_dir(self.tmp)
        if self.path.exists():
            if not self.overwrite:
                self.abort()
                raise RecordingError(f"{self.path} appeared while recording; not overwritten")
            trash = self.path.with_name(f".{self.path.name}.old-{secrets.token_hex(4)}")
            os.rename(self.path, trash)
            os.rename(self.tmp, self.path)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(self.tmp, self.path)
        _fsync_dir(self.path.parent)
        self._done = True
        return Bundle.open(self.path, verify=False)

    def abort(self) -> None:
        if not self._done:
            self._done = True
            shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> BundleWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # An exception (or a commit that never happened) discards the temporary directory.
        self.abort()


class Bundle:
    """An opened bundle: its manifest and access to its blobs, checked against their sha256."""

    def __init__(self, path: Path, manifest: Manifest) -> None:
        self.path = path
        self.manifest = manifest
        self._users = blob_users(manifest)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, verify: bool = False) -> Bundle:
        """Open and validate a bundle; ``verify`` also hashes every blob."""
        root = Path(path)
        if not root.is_dir():
            raise RecordingError(f"no recording bundle at {root}")
        manifest_path = root / MANIFEST_NAME
        if not manifest_path.is_file():
            raise RecordingError(f"{root} is not a recording bundle (no {MANIFEST_NAME})")
        try:
            data: Any = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{manifest_path}: not valid JSON ({exc})") from exc
        bundle = cls(root, Manifest.from_json(data))
        for sha in bundle.manifest.blobs:
            bundle._blob_file(sha)  # every blob must at least exist
        if verify:
            bundle.verify_checksums()
        return bundle

    @property
    def sha256(self) -> str:
        return self.manifest.sha256

    def _blob_file(self, sha: str) -> Path:
        raw = self.path / BLOB_DIR / sha
        if raw.is_file():
            return raw
        packed = raw.with_name(sha + _ZLIB_SUFFIX)
        if packed.is_file():
            return packed
        raise RecordingError(
            f"{self.path}: blob {sha[:12]} ({self._users.get(sha, 'unused')}) is missing"
        )

    def blob(self, sha: str, *, verify: bool = True) -> bytes:
        """The uncompressed content of a blob, checked against its name unless told not to."""
        if sha not in self.manifest.blobs:
            raise RecordingError(f"{self.path}: the manifest names no blob {sha[:12]}")
        path = self._blob_file(sha)
        data = path.read_bytes()
        if path.name.endswith(_ZLIB_SUFFIX):
            try:
                data = zlib.decompress(data)
            except zlib.error as exc:
                raise ChecksumMismatch(
                    f"{self.path}: blob {sha[:12]} ({self._users.get(sha, 'unused')}) "
                    f"does not decompress: {exc}"
                ) from exc
        if verify:
            actual = hashlib.sha256(data).hexdigest()
            if actual != sha or len(data) != self.manifest.blobs[sha]:
                raise ChecksumMismatch(
                    f"{self.path}: blob {sha[:12]} ({self._users.get(sha, 'unused')}) is "
                    f"corrupt: its content hashes to {actual[:12]}"
                )
        return data

    def verify_checksums(self) -> int:
        """Hash every blob; returns how many were checked."""
        for sha in self.manifest.blobs:
            self.blob(sha, verify=True)
        return len(self.manifest.blobs)

    def source(self) -> str | None:
        """The text of the kernel's main (first) source file, if the bundle stores it."""
        if not self.manifest.kernel.sources:
            return None
        return self.blob(self.manifest.kernel.sources[0].sha256).decode("utf-8")

    def header_texts(self) -> dict[str, str]:
        """The application headers the bundle carries, by their path in its header tree."""
        return {h.name: self.blob(h.sha256).decode("utf-8", errors="replace")
                for h in self.manifest.kernel.headers}

    def binary(self) -> bytes | None:
        b = self.manifest.kernel.binary
        return None if b is None else self.blob(b.sha256)

    def include_dirs(self, cache: Path | None = None) -> tuple[str, ...]:
        """The include directories to compile :meth:`source` with: the bundle's application
        headers written out as a tree (once per distinct set of headers, under ``cache``,
        default ``$R3_CACHE/headers`` or the user cache) and its include directories in it.
        Empty for a bundle that carries no headers."""
        k = self.manifest.kernel
        if not k.headers:
            return ()
        listing = canonical_json([[h.name, h.sha256] for h in k.headers])
        root = (cache or header_cache_dir()) / hashlib.sha256(listing).hexdigest()[:24]
        if not _tree_complete(root, k.headers, self.manifest.blobs):
            tmp = root.with_name(f".{root.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
            try:
                for h in k.headers:
                    target = tmp / h.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(self.blob(h.sha256))
                try:
                    os.rename(tmp, root)
                except OSError:  # another process's copy, or one that lost files: complete it
                    for h in k.headers:
                        target = root / h.name
                        if not target.is_file():
                            target.parent.mkdir(parents=True, exist_ok=True)
                            os.replace(tmp / h.name, target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        dirs = tuple(root / d for d in k.include_dirs) or (root,)
        for directory in dirs:
            # an include directory no carried header lies in (cfd: the unit's own folder,
            # its headers all under -I folders elsewhere) is still searched by the build
            directory.mkdir(parents=True, exist_ok=True)
        return tuple(str(d) for d in dirs)


def header_cache_dir() -> Path:
    """Where bundles' header trees are written out for compilers to read."""
    if os.environ.get("R3_CACHE"):
        return Path(os.environ["R3_CACHE"]) / "headers"
    import platformdirs

    return Path(platformdirs.user_cache_dir("r3tui")) / "headers"


def _tree_complete(root: Path, headers: tuple[SourceFile, ...], sizes: Mapping[str, int]) -> bool:
    return root.is_dir() and all(
        (root / h.name).is_file() and (root / h.name).stat().st_size == sizes[h.sha256]
        for h in headers
    )


def remove_stale_temporaries(parent: str | os.PathLike[str]) -> int:
    """Delete ``.<name>.tmp-*`` directories left by killed recorders; returns how many."""
    count = 0
    for entry in Path(parent).glob(".*.tmp-*"):
        if entry.is_dir():
            with contextlib.suppress(OSError):
                shutil.rmtree(entry)
                count += 1
    return count
