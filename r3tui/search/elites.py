"""MAP-Elites archive with islands: which kernel variants the outer loop keeps and breeds from.

The archive is a grid of cells over feature dimensions that mean something for GPU code
(register pressure × shared-memory use × transformation family by default); each cell holds the
fastest verified variant seen with those features (its *elite*).  A variant is only compared with
variants that resemble it, so a slow tiled kernel survives next to a fast untiled one and can
still be improved.  The population is split over islands that evolve apart and exchange their
best elites along a ring every few evaluations, which keeps one lucky family from taking over.

Driven from outside (by the engine), no I/O::

    archive = EliteArchive(ArchiveSettings(islands=2))
    island = archive.island_for(n_children)                 # round robin
    parent = archive.select_parent(island, rng)             # exploit or explore
    others = archive.inspirations(island, parent, rng)      # shown to the LLM with their times
    ...                                                     # remix, compile, verify, tune
    archive.offer(island, variant_id, describe(...), best_time_s)
    if archive.due_migration(n_evaluated):
        for elite, destination in archive.migrate(rng): ...  # persist the copies

Everything random takes the caller's ``random.Random`` (the engine derives it from the campaign
seed and the number of variants so far), and every choice is made from lists in a fixed order
(ties: lower fitness, then lower variant id, then cell key), so an archive rebuilt from its
stored cells with :meth:`EliteArchive.rebuild` makes the same choices as the one that crashed.
A stored cell holds only (island, cell key, variant id, fitness): the cell key is authoritative,
features are optional on rebuilt elites.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from r3tui.domain import EliteCell

__all__ = [
    "DEFAULT_FEATURES",
    "FAMILIES",
    "NOT_MEASURED",
    "OTHER",
    "ArchiveSettings",
    "Elite",
    "EliteArchive",
    "FeatureDim",
    "cell_coordinates",
    "cell_key",
    "describe",
]

NOT_MEASURED = "na"  # the bin of a descriptor the compiler or profiler did not report
OTHER = "other"  # the category of a family the dimension does not list
FAMILIES = ("seed", "memory", "tiling", "loops", "parallelism", "tuning")

_RESERVED = ("|", "=")  # separators of the cell key text


def _check_label(what: str, text: str) -> None:
    if not text or text != text.strip() or any(c in text for c in _RESERVED):
        raise ValueError(
            f"{what} {text!r} must be non-empty text without spaces around it, '|' or '='"
        )


@dataclass(frozen=True)
class FeatureDim:
    """One axis of the archive's grid.

    ``bins``: ``edges`` are inclusive upper bounds, in increasing order; bin ``i`` holds values
    ``edges[i-1] < v <= edges[i]`` and the last bin everything above the last edge, so edges
    ``(32, 64, 128)`` make the bins ``<=32``, ``33..64``, ``65..128``, ``>128`` (labels ``0`` to
    ``3`` in the cell key).  A missing (None) value falls into the bin ``na``.
    ``categories``: the value's text (stripped, lower case) when listed, else ``other``.
    ``descriptor`` is the key of the raw value in a variant's features (default: ``name``).
    """

    name: str
    kind: Literal["bins", "categories"]
    edges: tuple[float, ...] = ()
    categories: tuple[str, ...] = ()
    help: str = ""
    descriptor: str = ""

    def __post_init__(self) -> None:
        # Lists from JSON become tuples: the dimension stays hashable and compares equal.
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "categories", tuple(self.categories))
        _check_label("feature name", self.name)
        if self.kind == "bins":
            if not self.edges or self.categories:
                raise ValueError(f"bins dimension {self.name!r} needs edges and no categories")
            if not all(isinstance(e, int | float) and math.isfinite(e) for e in self.edges):
                raise ValueError(f"bins dimension {self.name!r}: edges must be finite numbers")
            if any(b <= a for a, b in zip(self.edges, self.edges[1:], strict=False)):
                raise ValueError(f"bins dimension {self.name!r}: edges must increase strictly")
        elif self.kind == "categories":
            if not self.categories or self.edges:
                raise ValueError(f"categories dimension {self.name!r} needs categories, no edges")
            for category in self.categories:
                _check_label(f"category of {self.name!r}", category)
                if category != category.lower():
                    raise ValueError(f"category {category!r} of {self.name!r} must be lower case")
            if len(set(self.categories)) != len(self.categories):
                raise ValueError(f"categories dimension {self.name!r} lists a category twice")
        else:
            raise ValueError(f"feature kind must be 'bins' or 'categories', got {self.kind!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "edges": list(self.edges),
            "categories": list(self.categories),
            "help": self.help,
            "descriptor": self.descriptor,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FeatureDim:
        return cls(
            str(data["name"]),
            data["kind"],
            tuple(data.get("edges", ())),
            tuple(data.get("categories", ())),
            str(data.get("help", "")),
            str(data.get("descriptor", "")),
        )

    @property
    def key(self) -> str:
        """The features key this dimension reads."""
        return self.descriptor or self.name

    def labels(self) -> tuple[str, ...]:
        """Every label a value can map to, in order (the grid's extent along this axis)."""
        if self.kind == "bins":
            return (*(str(i) for i in range(len(self.edges) + 1)), NOT_MEASURED)
        return self.categories if OTHER in self.categories else (*self.categories, OTHER)

    def label_of(self, value: Any) -> str:
        """The label of a raw descriptor value along this axis."""
        if self.kind == "categories":
            text = "" if value is None else str(value).strip().lower()
            return text if text in self.categories else OTHER
        if value is None:
            return NOT_MEASURED
        if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
            raise ValueError(f"feature {self.key!r} must be a number or None, got {value!r}")
        return str(bisect.bisect_left(self.edges, value))

    def describe_label(self, label: str) -> str:
        """What a label means, for people (``"33..64"``, ``"none"``...)."""
        if self.kind == "categories" or label == NOT_MEASURED:
            return label
        i = int(label)
        lo = None if i == 0 else self.edges[i - 1]
        hi = None if i == len(self.edges) else self.edges[i]
        if lo is None:
            return f"<={_number(hi)}"
        if hi is None:
            return f">{_number(lo)}"
        return f"{_number(lo)}<..<={_number(hi)}"


def _number(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


REGISTERS = FeatureDim(
    "regs",
    "bins",
    edges=(32, 64, 128),
    descriptor="registers",
    help="registers per thread: <=32 (full occupancy possible), <=64, <=128, >128; register "
    "pressure decides how many warps an SM can keep resident",
)
SHARED_MEMORY = FeatureDim(
    "smem",
    "bins",
    edges=(0, 16 * 1024),
    descriptor="shared_mem_bytes",
    help="shared memory per block (static + dynamic): none, <=16 KiB, more; whether and how "
    "hard a variant stages data in shared memory",
)
OCCUPANCY = FeatureDim(
    "occ",
    "bins",
    edges=(0.25, 0.5, 0.75),
    descriptor="occupancy",
    help="theoretical occupancy (resident warps / maximum): <=25%, <=50%, <=75%, more",
)
FAMILY = FeatureDim(
    "family",
    "categories",
    categories=FAMILIES,
    help="transformation family of the change that produced the variant (the remix "
    "catalogue's families; seed for the original); any other text counts as 'other'",
)

GRAIN = FeatureDim(
    "grain",
    "bins",
    edges=(1, 4),
    descriptor="elements_per_thread",
    help="elements a thread handles: its vector width (float4 loads: 4) times the elements "
    "per thread its launch gives it (// r3: work_per_thread); 1, 2 to 4, more (issue #19: "
    "coarsened and vectorized variants compete in cells of their own)",
)

DEFAULT_FEATURES: tuple[FeatureDim, ...] = (REGISTERS, SHARED_MEMORY, GRAIN, FAMILY)


def describe(
    registers: int | None, shared_mem_bytes: int | None, occupancy: float | None, family: str,
    *, vector_width: int = 1, work_per_thread: int = 1, threads_per_item: int = 1,
) -> dict[str, Any]:
    """The raw descriptor values of a variant, as stored in ``variants.features``
    (JSON-ready; :func:`cell_key` bins them)."""
    for name, count in (("registers", registers), ("shared_mem_bytes", shared_mem_bytes)):
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 0
        ):
            raise ValueError(f"{name} must be a non-negative integer or None, got {count!r}")
    if occupancy is not None and not (
        isinstance(occupancy, int | float) and 0.0 <= occupancy <= 1.0
    ):
        raise ValueError(f"occupancy must be a fraction in [0, 1] or None, got {occupancy!r}")
    if not isinstance(family, str):
        raise ValueError(f"family must be text, got {family!r}")
    for name, count in (("vector_width", vector_width), ("work_per_thread", work_per_thread),
                        ("threads_per_item", threads_per_item)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{name} must be a positive integer, got {count!r}")
    return {
        "registers": registers,
        "shared_mem_bytes": shared_mem_bytes,
        "occupancy": None if occupancy is None else float(occupancy),
        "family": family,
        "vector_width": vector_width,
        "work_per_thread": work_per_thread,
        "threads_per_item": threads_per_item,
        # below 1 where several threads share an element
        "elements_per_thread": (vector_width * work_per_thread if threads_per_item == 1
                                else vector_width * work_per_thread / threads_per_item),
    }


def cell_key(features: Mapping[str, Any], dims: tuple[FeatureDim, ...] = DEFAULT_FEATURES) -> str:
    """The stable text name of the cell ``features`` fall into, e.g.
    ``"regs=1|smem=0|family=tiling"`` (dimensions in declared order; a missing descriptor
    counts as None)."""
    return "|".join(f"{d.name}={d.label_of(features.get(d.key))}" for d in dims)


def cell_coordinates(key: str, dims: tuple[FeatureDim, ...] = DEFAULT_FEATURES) -> dict[str, str]:
    """The labels of a cell key, checked against ``dims`` (ValueError when it is not one of
    their cells, e.g. a key stored under other feature settings)."""
    parts = key.split("|")
    if len(parts) != len(dims):
        raise ValueError(
            f"cell key {key!r} does not have the {len(dims)} dimensions "
            f"{', '.join(d.name for d in dims)}"
        )
    out: dict[str, str] = {}
    for part, dim in zip(parts, dims, strict=True):
        name, _, label = part.partition("=")
        if name != dim.name or label not in dim.labels():
            raise ValueError(f"cell key {key!r}: {part!r} is not a cell of dimension {dim.name!r}")
        out[name] = label
    return out


@dataclass(frozen=True)
class ArchiveSettings:
    """How the archive is shaped and how parents, inspirations and migrants are chosen."""

    islands: int = field(default=2, metadata={"help": "populations that evolve apart"})
    migration_interval: int = field(
        default=10, metadata={"help": "variants evaluated between two migrations"}
    )
    migrants: int = field(
        default=1, metadata={"help": "elites each island sends to the next at a migration"}
    )
    exploit: float = field(
        default=0.7,
        metadata={
            "help": "probability of picking a parent among the island's "
            "fittest elites rather than uniformly among its cells"
        },
    )
    inspirations: int = field(
        default=2, metadata={"help": "other elites shown to the model next to the parent"}
    )
    fittest: int = field(
        default=3,
        metadata={
            "help": "how many of the island's fastest elites an exploiting "
            "parent pick chooses among"
        },
    )
    features: tuple[FeatureDim, ...] = field(
        default=DEFAULT_FEATURES, metadata={"help": "the archive's feature dimensions"}
    )

    def __post_init__(self) -> None:
        for name in ("islands", "migration_interval", "fittest"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("migrants", "inspirations"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if not 0.0 <= self.exploit <= 1.0:
            raise ValueError(f"exploit must be a probability in [0, 1], got {self.exploit!r}")
        if not self.features:
            raise ValueError("an archive needs at least one feature dimension")
        names = [d.name for d in self.features]
        if len(set(names)) != len(names):
            raise ValueError(f"feature names must be distinct, got {names}")

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, for a campaign's stored settings."""
        return {
            "islands": self.islands,
            "migration_interval": self.migration_interval,
            "migrants": self.migrants,
            "exploit": self.exploit,
            "inspirations": self.inspirations,
            "fittest": self.fittest,
            "features": [d.to_json() for d in self.features],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArchiveSettings:
        """Settings stored by :meth:`to_json`; missing keys take their defaults."""
        values: dict[str, Any] = {
            k: data[k]
            for k in (
                "islands",
                "migration_interval",
                "migrants",
                "exploit",
                "inspirations",
                "fittest",
            )
            if k in data
        }
        if "features" in data:
            values["features"] = tuple(FeatureDim.from_json(d) for d in data["features"])
        return cls(**values)

    @property
    def cells_per_island(self) -> int:
        return math.prod(len(d.labels()) for d in self.features)


@dataclass(frozen=True)
class Elite:
    """The fastest variant of one cell of one island.  ``features`` are the raw descriptors
    it was offered with (empty on elites rebuilt from stored cells; not compared)."""

    island: int
    cell_key: str
    variant_id: int
    fitness_s: float  # best time of the variant's inner search; lower is better
    features: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def rank(self) -> tuple[float, int, str]:
        """Sort key: fastest first, ties to the lower variant id (then the cell, for a total
        order when one variant sits in two cells)."""
        return (self.fitness_s, self.variant_id, self.cell_key)

    def beats(self, other: Elite) -> bool:
        return (self.fitness_s, self.variant_id) < (other.fitness_s, other.variant_id)


def _check_fitness(fitness_s: float) -> float:
    if isinstance(fitness_s, bool) or not isinstance(fitness_s, int | float):
        raise ValueError(f"fitness must be a time in seconds, got {fitness_s!r}")
    value = float(fitness_s)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"fitness must be a finite, non-negative time, got {fitness_s!r}")
    return value


def _check_variant(variant_id: int) -> int:
    if isinstance(variant_id, bool) or not isinstance(variant_id, int):
        raise ValueError(f"variant id must be an integer, got {variant_id!r}")
    return variant_id


class EliteArchive:
    """Islands of MAP-Elites cells; see the module docstring for how the engine drives it."""

    def __init__(self, settings: ArchiveSettings | None = None) -> None:
        self.settings = settings or ArchiveSettings()
        self._cells: list[dict[str, Elite]] = [{} for _ in range(self.settings.islands)]

    # -- insertion -----------------------------------------------------------------------
    def offer(
        self, island: int, variant_id: int, features: Mapping[str, Any], fitness_s: float
    ) -> Elite | None:
        """Place a verified variant in its cell of ``island``: the new elite when the cell was
        empty or its incumbent was slower (equal times: the lower variant id stays), else None."""
        self._check_island(island)
        candidate = Elite(
            island,
            cell_key(features, self.settings.features),
            _check_variant(variant_id),
            _check_fitness(fitness_s),
            dict(features),
        )
        return self._place(candidate)

    def _place(self, candidate: Elite) -> Elite | None:
        cells = self._cells[candidate.island]
        incumbent = cells.get(candidate.cell_key)
        if incumbent is not None and not candidate.beats(incumbent):
            return None
        cells[candidate.cell_key] = candidate
        return candidate

    # -- selection -----------------------------------------------------------------------
    def select_parent(self, island: int, rng: random.Random) -> Elite | None:
        """With probability ``exploit`` one of the island's ``fittest`` fastest elites, else any
        of its elites uniformly (by cell); None while the island is empty."""
        self._check_island(island)
        by_cell = self.elites(island)
        if not by_cell:
            return None
        if rng.random() < self.settings.exploit:
            ranked = sorted(by_cell, key=Elite.rank)
            return ranked[rng.randrange(min(self.settings.fittest, len(ranked)))]
        return by_cell[rng.randrange(len(by_cell))]

    def inspirations(
        self, island: int, parent: Elite, rng: random.Random, k: int | None = None
    ) -> list[Elite]:
        """Up to ``k`` (default: the settings') other elites of the island to show next to the
        parent: the fastest half from other cells, the rest drawn uniformly from the remaining
        cells for diversity.  Never the parent's variant, never one variant twice."""
        self._check_island(island)
        want = self.settings.inspirations if k is None else k
        if want < 0:
            raise ValueError(f"k must be non-negative, got {want!r}")
        pool: list[Elite] = []
        seen = {parent.variant_id}
        for elite in sorted(self._cells[island].values(), key=Elite.rank):
            if elite.variant_id not in seen:
                seen.add(elite.variant_id)
                pool.append(elite)
        n_best = min((want + 1) // 2, len(pool))
        chosen, rest = pool[:n_best], pool[n_best:]
        while len(chosen) < want and rest:
            chosen.append(rest.pop(rng.randrange(len(rest))))
        return chosen

    def island_for(self, n: int) -> int:
        """The island that proposes the ``n``-th child (0-based, round robin)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"child index must be a non-negative integer, got {n!r}")
        return n % self.settings.islands

    # -- migration -----------------------------------------------------------------------
    def due_migration(self, n_evaluated: int) -> bool:
        """Whether to migrate now, after the ``n_evaluated``-th evaluated variant (stateless, so
        a resumed campaign migrates at the same counts: call it after every evaluation)."""
        if n_evaluated < 0:
            raise ValueError(f"evaluated count must be non-negative, got {n_evaluated!r}")
        return (
            self.settings.islands > 1
            and self.settings.migrants > 0
            and n_evaluated > 0
            and n_evaluated % self.settings.migration_interval == 0
        )

    def migrate(self, rng: random.Random) -> list[tuple[Elite, int]]:
        """Each island sends copies of ``migrants`` elites to the next island on the ring: its
        fastest one, the others drawn at random among the rest (diversity, not only speed).  A
        copy keeps its variant id, cell and time and enters the destination cell only where it
        beats the incumbent, so no island loses anything but slower elites.  Migrants are chosen
        from the archive as it was before this migration.  Returns the copies that entered, as
        (copy, destination island)."""
        islands = self.settings.islands
        if islands < 2 or self.settings.migrants == 0:
            return []
        outgoing: list[tuple[Elite, int]] = []
        for source in range(islands):
            ranked = sorted(self._cells[source].values(), key=Elite.rank)
            if not ranked:
                continue
            sent, rest = [ranked[0]], ranked[1:]
            while len(sent) < self.settings.migrants and rest:
                sent.append(rest.pop(rng.randrange(len(rest))))
            destination = (source + 1) % islands
            outgoing += [(elite, destination) for elite in sent]
        moved: list[tuple[Elite, int]] = []
        for elite, destination in outgoing:
            copy = Elite(
                destination, elite.cell_key, elite.variant_id, elite.fitness_s, elite.features
            )
            if self._place(copy) is not None:
                moved.append((copy, destination))
        return moved

    # -- reading -------------------------------------------------------------------------
    def elites(self, island: int | None = None) -> list[Elite]:
        """The elites of ``island`` (all islands when None), ordered by island then cell key."""
        if island is not None:
            self._check_island(island)
            return [self._cells[island][k] for k in sorted(self._cells[island])]
        return [e for i in range(self.settings.islands) for e in self.elites(i)]

    def best(self) -> Elite | None:
        """The fastest elite of the whole archive (ties: lower variant id, lower island)."""
        every = self.elites()
        return min(every, key=lambda e: (*e.rank(), e.island)) if every else None

    def coverage(self, island: int | None = None) -> float:
        """Fraction of the grid's cells that hold an elite (on one island or all of them)."""
        islands = [island] if island is not None else list(range(self.settings.islands))
        filled = sum(len(self.elites(i)) for i in islands)
        return filled / (self.settings.cells_per_island * len(islands))

    def to_cells(self, campaign_id: int) -> list[EliteCell]:
        """The archive as the rows the database stores."""
        return [
            EliteCell(campaign_id, e.island, e.cell_key, e.variant_id, e.fitness_s)
            for e in self.elites()
        ]

    def __len__(self) -> int:
        return sum(len(cells) for cells in self._cells)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EliteArchive):
            return NotImplemented
        return self.settings == other.settings and self._cells == other._cells

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return (
            f"EliteArchive(islands={self.settings.islands}, elites={len(self)}, "
            f"best={self.best()!r})"
        )

    # -- resume --------------------------------------------------------------------------
    @classmethod
    def rebuild(cls, settings: ArchiveSettings, cells: Iterable[Elite | EliteCell]) -> EliteArchive:
        """The archive stored as ``cells`` (:class:`Elite` values or the database's
        :class:`~r3tui.domain.EliteCell` rows).  Each cell key must be a cell of
        ``settings.features`` (ValueError otherwise); of two entries for one cell the faster
        one stays."""
        archive = cls(settings)
        for cell in cells:
            archive._check_island(cell.island)
            cell_coordinates(cell.cell_key, settings.features)
            features = cell.features if isinstance(cell, Elite) else {}
            archive._place(
                Elite(
                    cell.island,
                    cell.cell_key,
                    _check_variant(cell.variant_id),
                    _check_fitness(cell.fitness_s),
                    dict(features),
                )
            )
        return archive

    def _check_island(self, island: int) -> None:
        if (
            isinstance(island, bool)
            or not isinstance(island, int)
            or not 0 <= island < self.settings.islands
        ):
            raise ValueError(f"island must be 0..{self.settings.islands - 1}, got {island!r}")
