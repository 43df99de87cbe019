"""Realistic synthetic campaign databases for the UI tests and ``bench/tui_load.py``.

A real SQLite file made through ``open_database`` (migrated to head) and filled with ORM /
Core inserts that follow the schema exactly as the engine writes it: a recording whose
manifest carries the original's baseline time, a campaign with provenance, a seed variant,
LLM and rule variants forming a tree (``parent_id``), every status of the validation funnel
with a reason, MAP-Elites features and cells per island, LLM calls, trials with configs
and compiler resources, and the event log.  Everything comes from one seeded RNG and fixed
timestamps, so a snapshot of a screen is the same on every run.
"""

from __future__ import annotations

import bisect
import difflib
import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from db import repository as repo
from db.models import (
    CampaignRow,
    EliteCellRow,
    EventRow,
    LLMCallRow,
    RecordingRow,
    TrialRow,
    VariantRow,
)
from db.session import Database, open_database
from r3tui.domain import (
    CampaignStatus,
    Dim3,
    Measurement,
    MeasurementStatus,
    ResourceUsage,
    TimeStats,
    TrialConfig,
    Variant,
    VariantOrigin,
    VariantStatus,
)

T0 = datetime(2026, 12, 2, 14, 0, 0, tzinfo=UTC)
KERNEL_SOURCE = (Path(__file__).resolve().parents[2] / "examples/stencil7/kernel.cu").read_text()

# (operator, family, edit applied to the parent's source)
TRANSFORMATIONS: tuple[tuple[str, str, str], ...] = (
    ("restrict_pointers", "memory", "const double* __restrict__ in"),
    ("ldg_loads", "memory", "__ldg(&in[idx])"),
    ("shared_tile_xy", "tiling", "__shared__ double tile[10][34];"),
    ("register_block_z", "tiling", "double below = in[idx - sz], here = in[idx];"),
    ("unroll_z_loop", "loops", "#pragma unroll 4"),
    ("int32_index", "loops", "int idx = (k * ny + j) * nx + i;"),
    ("two_points_per_thread", "parallelism", "for (int kk = 0; kk < 2; ++kk) {"),
    ("launch_bounds_256", "tuning", "__launch_bounds__(256, 4)"),
)
FAILURE_REASONS = {
    VariantStatus.APPLY_FAILED: "the rewrite's anchor line is not in the parent source",
    VariantStatus.COMPILE_FAILED: 'kernel.cu(21): error: identifier "tile" is undefined',
    VariantStatus.WRONG_RESULT: "out: max |a-b| 3.1e-02 > atol 0 + rtol 1e-12 (linf)",
    VariantStatus.CRASHED: "CUDA_ERROR_ILLEGAL_ADDRESS in the replay worker (restarted)",
}
# Weights of the outcome of one evaluated child; the running campaign's last few stay pending.
OUTCOMES = (
    (VariantStatus.IMPROVED, 14),
    (VariantStatus.VERIFIED, 30),
    (VariantStatus.COMPILE_FAILED, 26),
    (VariantStatus.WRONG_RESULT, 16),
    (VariantStatus.APPLY_FAILED, 10),
    (VariantStatus.CRASHED, 4),
)
OPTIONS = (
    "--use_fast_math",
    "--ftz=true",
    "--prec-div=false",
    "--extra-device-vectorization",
    "--ptxas-options=-O2",
    "--ptxas-options=-dlcm=ca",
    "--restrict",
)
BLOCKS = ((32, 4, 2), (64, 4, 1), (32, 8, 1), (128, 2, 1), (16, 16, 1), (8, 8, 8), (256, 1, 1))
# A variant that fails after the compiler ran has one trial row with the failure.
FAILED_TRIAL = {
    VariantStatus.COMPILE_FAILED: MeasurementStatus.COMPILE_ERROR,
    VariantStatus.WRONG_RESULT: MeasurementStatus.WRONG_RESULT,
    VariantStatus.CRASHED: MeasurementStatus.CRASHED,
}
GPU = {"name": "NVIDIA H200", "arch": "sm_90", "driver_version": 13000}


@dataclass(frozen=True)
class CampaignSpec:
    """One campaign to generate."""

    name: str = "stencil7-evolve"
    n_variants: int = 60
    n_trials: int = 800
    islands: int = 2
    status: CampaignStatus = CampaignStatus.FINISHED
    kernel: str = "stencil7"
    original_s: float = 104.2e-6
    pending_tail: int = 0  # the last variants stay pending (a campaign still running)
    seed: int = 7


@dataclass(frozen=True)
class BuiltCampaign:
    id: int
    seed_variant_id: int
    variant_ids: tuple[int, ...]
    last_at: datetime


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _manifest(kernel: str, original_s: float) -> dict[str, Any]:
    return {
        "format_version": 1,
        "kernel": {"name": kernel, "entry_point": kernel, "toolchain": "nvrtc"},
        "launch": {
            "grid": [32, 32, 32],
            "block": [8, 8, 8],
            "shared_mem_bytes": 0,
            "work": [256, 256, 256],
            "baseline": {"median_s": original_s, "min_s": original_s * 0.99, "n": 8},
        },
    }


def _mutate(parent: str, operator: str, edit: str, serial: int) -> str:
    """The parent's source with one named edit inserted: a real, small unified diff."""
    lines = parent.splitlines()
    at = min(len(lines) - 2, 12 + serial % 8)
    return "\n".join([*lines[:at], f"    // {operator}: {edit}", *lines[at:]]) + "\n"


def _diff(parent: str, child: str) -> str:
    return "".join(
        difflib.unified_diff(
            parent.splitlines(keepends=True),
            child.splitlines(keepends=True),
            "parent/kernel.cu",
            "variant/kernel.cu",
        )
    )


def _config(rng: random.Random) -> TrialConfig:
    block = rng.choice(BLOCKS)
    threads = block[0] * block[1] * block[2]
    return TrialConfig(
        toolchain="nvrtc",
        options=tuple(sorted(rng.sample(OPTIONS, rng.randint(0, 3)))),
        block=Dim3(*block),
        tunables={},
        launch_bounds=(threads, rng.choice((1, 2, 4))),
    )


def _trial_row(
    campaign_id: int,
    variant_id: int,
    rng: random.Random,
    at: datetime,
    time_s: float | None,
    failure: MeasurementStatus | None = None,
) -> dict[str, Any]:
    if failure is not None:
        measurement = Measurement(
            status=failure,
            compile_time_s=0.011,
            error_text=FAILURE_REASONS[VariantStatus.COMPILE_FAILED]
            if failure is MeasurementStatus.COMPILE_ERROR
            else f"{failure.value} during replay",
        )
    else:
        assert time_s is not None
        measurement = Measurement(
            status=MeasurementStatus.OK,
            time=TimeStats(time_s, time_s * 0.985, time_s * 0.01, 8),
            verified=True,
            max_error=0.0,
            resources=ResourceUsage(
                registers=rng.choice((22, 32, 40, 56, 64, 96)),
                spill_stores_bytes=0,
                spill_loads_bytes=0,
                shared_mem_bytes=rng.choice((0, 0, 2720)),
                local_mem_bytes=0,
                max_threads_per_block=1024,
            ),
            compile_time_s=round(rng.uniform(0.008, 0.014), 4),
            replay_wall_s=round(rng.uniform(0.002, 0.006), 4),
            binary_sha256=_sha(f"{variant_id}-{time_s}"),
        )
    values = repo._trial_values(campaign_id, variant_id, _config(rng), measurement)
    values["created_at"] = at
    return values


def _outcome(rng: random.Random) -> VariantStatus:
    statuses = [s for s, _ in OUTCOMES]
    return rng.choices(statuses, weights=[w for _, w in OUTCOMES])[0]


def _trial_counts(n_timed: int, n_trials: int, rng: random.Random) -> Iterator[int]:
    """Spread ``n_trials`` over the timed variants (each gets at least one)."""
    base, extra = divmod(max(n_trials, n_timed), max(n_timed, 1))
    for i in range(n_timed):
        yield base + (1 if i < extra else 0)


def add_campaign(s: Session, spec: CampaignSpec) -> BuiltCampaign:
    """Insert one campaign with its whole search history; returns its ids."""
    rng = random.Random(spec.seed)
    recording = RecordingRow(
        bundle_path=f"/scratch/r3/{spec.kernel}-{spec.seed}.r3b",
        sha256=_sha(f"{spec.name}-{spec.seed}"),
        kernel_name=spec.kernel,
        grid_x=32,
        grid_y=32,
        grid_z=32,
        block_x=8,
        block_y=8,
        block_z=8,
        shared_mem_bytes=0,
        launch_count=1,
        launch_total_time_s=spec.original_s,
        manifest=_manifest(spec.kernel, spec.original_s),
        created_at=T0 - timedelta(minutes=5),
    )
    s.add(recording)
    s.flush()
    campaign = CampaignRow(
        name=spec.name,
        recording_id=recording.id,
        seed=spec.seed,
        settings={"mode": "evolve", "budget_trials": spec.n_trials, "islands": spec.islands},
        provenance={"gpu": GPU, "toolchain": "nvrtc", "toolchain_version": "nvrtc 13.0"},
        status=spec.status,
        started_at=T0,
        finished_at=None,
        updated_at=T0,
    )
    s.add(campaign)
    s.flush()
    cid = campaign.id
    clock = T0
    events: list[dict[str, Any]] = []

    def event(kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        events.append(
            {
                "campaign_id": cid,
                "created_at": clock,
                "kind": kind,
                "message": message,
                "data": data,
            }
        )

    event("start", f"evolutionary search on NVIDIA H200, {spec.islands} islands, seed {spec.seed}")
    seed = VariantRow(
        campaign_id=cid,
        parent_id=None,
        source=KERNEL_SOURCE,
        diff=None,
        origin=VariantOrigin.SEED,
        operator="original",
        status=VariantStatus.VERIFIED,
        status_reason=None,
        island=0,
        features={"registers": 22, "shared_mem_bytes": 0, "occupancy": 1.0, "family": "seed"},
        created_at=clock,
    )
    s.add(seed)
    s.flush()
    # (best time, id, source, island) of every variant that can be a parent, fastest first
    pool: list[tuple[float, int, str, int]] = [(spec.original_s, seed.id, KERNEL_SOURCE, 0)]
    variant_ids = [seed.id]
    statuses: dict[int, VariantStatus] = {seed.id: VariantStatus.VERIFIED}
    elites: dict[tuple[int, str], tuple[float, int]] = {}
    # Outcomes first, so the trial budget can be spread over the variants that get timed.
    outcomes = [
        VariantStatus.PENDING if serial >= spec.n_variants - spec.pending_tail else _outcome(rng)
        for serial in range(1, spec.n_variants)
    ]
    n_timed = 1 + sum(o in (VariantStatus.IMPROVED, VariantStatus.VERIFIED) for o in outcomes)
    n_failed = sum(o in FAILED_TRIAL for o in outcomes)
    counts = iter(_trial_counts(n_timed, spec.n_trials - n_failed, rng))
    trial_rows: list[dict[str, Any]] = []

    def add_trials(
        vid: int, n: int, time_s: float | None, failure: MeasurementStatus | None
    ) -> None:
        nonlocal clock
        for _ in range(n):
            clock += timedelta(milliseconds=rng.randint(40, 90))
            jitter = None if time_s is None else time_s * rng.uniform(1.0, 1.35)
            trial_rows.append(_trial_row(cid, vid, rng, clock, jitter, failure))

    add_trials(seed.id, next(counts), spec.original_s * 0.9, None)
    for serial in range(1, spec.n_variants):
        # parents are drawn from the better half, the way an elite archive biases selection
        parent_s, parent_id, parent_src, parent_island = pool[rng.randrange(max(1, len(pool) // 2))]
        operator, family, edit = TRANSFORMATIONS[rng.randrange(len(TRANSFORMATIONS))]
        origin = VariantOrigin.LLM if rng.random() < 0.6 else VariantOrigin.RULE
        island = parent_island if rng.random() < 0.9 else rng.randrange(spec.islands)
        if serial < spec.islands:
            island = serial  # every island gets a first child of the seed
        source = _mutate(parent_src, operator, edit, serial)
        status = outcomes[serial - 1]
        pending = status is VariantStatus.PENDING
        if status is VariantStatus.IMPROVED:
            time_s = parent_s * rng.uniform(0.78, 0.97)
        elif status is VariantStatus.VERIFIED:
            time_s = parent_s * rng.uniform(1.0, 1.25)
        else:
            time_s = None
        regs = rng.choice((22, 30, 40, 64, 72, 130))
        smem = 2720 if family == "tiling" else 0
        features = {
            "registers": regs,
            "shared_mem_bytes": smem,
            "occupancy": 1.0 if regs <= 32 else 0.5,
            "family": family,
        }
        clock += timedelta(milliseconds=rng.randint(300, 2500))
        llm_call_id = None
        if origin is VariantOrigin.LLM:
            call = LLMCallRow(
                campaign_id=cid,
                prompt=_prompt(spec.kernel, operator, parent_src),
                response=f"```cuda\n{source}```\n",
                model_path="/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                model_sha256=_sha("qwen2.5-coder-1.5b"),
                sampling={"temperature": 0.7, "top_p": 0.95, "max_tokens": 1024, "grammar": "cuda"},
                seed=spec.seed * 1000 + serial,
                tokens_in=rng.randint(700, 1100),
                tokens_out=rng.randint(380, 620),
                latency_s=round(rng.uniform(18.0, 41.0), 2),
                backend="llama_cpp",
                created_at=clock,
            )
            s.add(call)
            s.flush()
            llm_call_id = call.id
        row = VariantRow(
            campaign_id=cid,
            parent_id=parent_id,
            source=source,
            diff=_diff(parent_src, source),
            origin=origin,
            operator=operator,
            status=status,
            status_reason=FAILURE_REASONS.get(status),
            island=island,
            features=features if time_s is not None else {"family": family},
            llm_call_id=llm_call_id,
            created_at=clock,
        )
        s.add(row)
        s.flush()
        variant_ids.append(row.id)
        statuses[row.id] = status
        if status is VariantStatus.APPLY_FAILED or pending:
            pass  # never reached the compiler
        elif time_s is None:
            add_trials(row.id, 1, None, FAILED_TRIAL[status])
        else:
            add_trials(row.id, next(counts, 1), time_s, None)
            bisect.insort(pool, (time_s, row.id, source, island))
            key = f"regs={min(3, regs // 33)}|smem={0 if smem == 0 else 1}|family={family}"
            if (island, key) not in elites or elites[(island, key)][0] > time_s:
                elites[(island, key)] = (time_s, row.id)
        if not pending:
            best = f"{time_s * 1e6:.1f} µs" if time_s else "no time"
            event(
                "variant",
                f"#{row.id} {origin.value}:{operator} → {status.value} ({best})",
                {"variant_id": row.id, "status": status.value, "best_s": time_s},
            )
        if serial % 25 == 0:
            event("generation", f"generation {serial // 25}: {len(elites)} cells occupied")
        if serial % 100 == 50 and spec.islands > 1:
            event("migration", f"island 0 → island 1: {len(elites) % 5 + 1} elites migrated")
    if spec.status is CampaignStatus.FINISHED:
        event("finish", f"budget spent: {len(trial_rows)} trials, {spec.n_variants} variants")
    elif spec.status is CampaignStatus.STOPPED:
        event("stop", "stopped by request")
    elif spec.status is CampaignStatus.CRASHED:
        event("crash", "the engine died: replay worker lost (resume with --resume)")
    _insert_trials(s, trial_rows, variant_ids)
    for (island, key), (fitness, vid) in sorted(elites.items()):
        s.add(
            EliteCellRow(
                campaign_id=cid,
                island=island,
                cell_key=key,
                variant_id=vid,
                fitness_s=fitness,
                updated_at=clock,
            )
        )
    if events:
        s.execute(insert(EventRow), events)
    finished = spec.status in (CampaignStatus.FINISHED, CampaignStatus.STOPPED)
    campaign.finished_at = clock if finished else None
    campaign.updated_at = clock
    return BuiltCampaign(cid, seed.id, tuple(variant_ids), clock)


def _insert_trials(s: Session, rows: list[dict[str, Any]], variant_ids: list[int]) -> None:
    """Insert in batches, then point each variant's best_trial_id at its fastest ok trial."""
    for start in range(0, len(rows), 20000):
        s.execute(insert(TrialRow), rows[start : start + 20000])
    s.flush()
    s.connection().exec_driver_sql(
        """
        UPDATE variants SET best_trial_id = (
            SELECT t.id FROM trials t
            WHERE t.variant_id = variants.id AND t.status = 'ok'
            ORDER BY t.median_s, t.id LIMIT 1)
        WHERE campaign_id = (SELECT campaign_id FROM variants WHERE id = ?)
        """,
        (variant_ids[0],),
    )


SYSTEM_PROMPT = (
    "You are a CUDA performance engineer. You make exactly one small, named change to a "
    "kernel and answer only in the format you are asked for."
)


def _prompt(kernel: str, operator: str, parent: str) -> str:
    """As the engine stores a prompt (``r3tui.remix.backends.render_prompt``): the chat
    messages as compact JSON."""
    user = (
        f"You optimise the CUDA kernel `{kernel}` for an NVIDIA H200 (sm_90).\n"
        f"Apply the transformation `{operator}` and nothing else. Keep the signature.\n"
        "Answer with the whole kernel in one ```cuda block.\n\n"
        f"```cuda\n{parent}```\n"
    )
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":"))


def build_database(path: Path, specs: tuple[CampaignSpec, ...] = (CampaignSpec(),)) -> Path:
    """Create ``path`` (migrated to head) holding the given campaigns; returns the path."""
    db = open_database(path, create=True)
    try:
        with db.session_scope() as s:
            for spec in specs:
                add_campaign(s, spec)
    finally:
        db.close()
    return path


STANDARD_CAMPAIGNS = (
    CampaignSpec(),
    CampaignSpec(
        name="sgemm-evolve",
        kernel="sgemm",
        n_variants=30,
        n_trials=300,
        status=CampaignStatus.RUNNING,
        original_s=758.3e-6,
        pending_tail=2,
        seed=11,
    ),
    CampaignSpec(
        name="softmax-crash",
        kernel="softmax",
        n_variants=8,
        n_trials=60,
        islands=1,
        status=CampaignStatus.CRASHED,
        original_s=67.4e-6,
        seed=3,
    ),
)


def add_live_variant(
    db: Database, campaign_id: int, parent_id: int, serial: int, *, time_s: float = 80e-6
) -> int:
    """What the engine does for one variant: insert it, its trials, then its outcome."""
    rng = random.Random(serial)
    with db.session_scope() as s:
        parent = repo.get_variant(s, parent_id)
        assert parent is not None
        operator, family, edit = TRANSFORMATIONS[serial % len(TRANSFORMATIONS)]
        source = _mutate(parent.source, operator, edit, serial)
        vid = repo.add_variant(
            s,
            Variant(
                campaign_id=campaign_id,
                source=source,
                origin=VariantOrigin.RULE,
                parent_id=parent_id,
                diff=_diff(parent.source, source),
                operator=operator,
                features={"family": family},
            ),
        )
        now = datetime.now(UTC)
        rows = [_trial_row(campaign_id, vid, rng, now, time_s) for _ in range(3)]
        trial_ids = list(s.execute(insert(TrialRow).returning(TrialRow.id), rows).scalars())
        repo.update_variant(s, vid, status=VariantStatus.IMPROVED, best_trial_id=trial_ids[0])
        repo.add_event(s, campaign_id, "variant", f"#{vid} rule:{operator} → improved")
    return vid
