"""What a campaign has already, so that a proposal that would measure nothing new is counted and
not stored (docs/remix.md, "Duplicates").

Two answers: whether a source is one of the campaign's up to comments and layout
(:func:`r3tui.analysis.text.code_key`, asked from the model's thread too), and whether its
compiled code together with its ``// r3:`` lines is a compiled variant's (:func:`compiled_code`,
the compile the variant's first trial would make).
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from r3tui.domain import VariantStatus

if TYPE_CHECKING:
    from r3tui.engine.inner import InnerSettings, KernelSource
    from r3tui.record.manifest import LaunchInfo
    from r3tui.search import DeviceLimits

# variants whose sources are not what they compile (their parent's, stored for the record)
NOT_COMPILED = (VariantStatus.APPLY_FAILED, VariantStatus.UNSAFE)
_DIRECTIVE = re.compile(r"\s*//\s*r3\s*:")


def compiled_code(evaluator_for: Callable[[KernelSource], Any] | None, seed: KernelSource,
                  source: str, launch: LaunchInfo, inner: InnerSettings,
                  limits: DeviceLimits) -> str | None:
    """What two sources share when they are the same candidate: the compiler's code hash at
    the baseline configuration, with the source's ``// r3:`` lines (the search it declares).
    None where it cannot be told: an evaluator that does not compile, a space that does not
    build, a compile that fails (the evaluation then says why)."""
    from r3tui.engine.inner import build_space
    from r3tui.errors import R3Error

    if evaluator_for is None:
        return None
    variant_source = replace(seed, text=source)
    code_hash = getattr(evaluator_for(variant_source), "code_hash", None)
    if code_hash is None:
        return None
    try:
        config = build_space(launch, variant_source, inner, limits).baseline_config()
    except (R3Error, ValueError):
        return None
    digest = code_hash(config)
    if digest is None:
        return None
    declared = [line.strip() for line in source.splitlines() if _DIRECTIVE.match(line)]
    return hashlib.sha256("\n".join([digest, *declared]).encode()).hexdigest()[:32]


class Novelty:
    """One campaign's sources and compiled codes, read from the database as they are needed."""

    def __init__(self, campaign_id: int, code_of: Callable[[str], str | None]) -> None:
        self.campaign_id = campaign_id
        self.code_of = code_of
        # code_key of every stored variant up to id _keyed_upto (sources are compared up to
        # comments and layout)
        self._keys: set[str] = set()
        self._keyed_upto = 0
        self._lock = threading.Lock()
        self._codes: dict[str, int] | None = None  # code -> variant, built at first use

    def has_source(self, s: Any, source: str) -> bool:
        """Whether a variant of the campaign has ``source`` up to comments and layout (any
        thread)."""
        from db import repository as repo
        from r3tui.analysis.text import code_key

        with self._lock:  # the model's thread asks too
            for vid, text in repo.variant_sources_after(s, self.campaign_id, self._keyed_upto):
                self._keys.add(code_key(text))
                self._keyed_upto = vid
            return code_key(source) in self._keys

    def has_code(self, code: str) -> bool:
        """Whether a compiled variant of the campaign has ``code`` (after :meth:`load`)."""
        assert self._codes is not None, "Novelty.load first"
        return code in self._codes

    def add_code(self, code: str, variant_id: int) -> None:
        if self._codes is not None:
            self._codes.setdefault(code, variant_id)

    def load(self, database: Any) -> None:
        """Code -> variant for the campaign's compiled variants, once: read from their
        features, computed (and stored) for those stored without it: the seed, a campaign
        resumed from before the check.  The compiles run outside any transaction."""
        from db import repository as repo

        if self._codes is not None:
            return
        with database.session_scope() as s:
            variants = [v for v in repo.campaign_variants(s, self.campaign_id)
                        if v.status not in NOT_COMPILED and v.id is not None]
        codes: dict[str, int] = {}
        computed = []
        for variant in variants:
            assert variant.id is not None
            code = variant.features.get("code")
            if not isinstance(code, str):
                code = self.code_of(variant.source)
                if code is None:
                    continue
                computed.append((variant, code))
            codes.setdefault(code, variant.id)
        if computed:
            with database.session_scope() as s:
                for variant, code in computed:
                    assert variant.id is not None
                    repo.update_variant(s, variant.id,
                                        features={**variant.features, "code": code})
        self._codes = codes
