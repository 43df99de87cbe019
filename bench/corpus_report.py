"""The report of bench/corpus.py: one row per program and the corpus_* figures of issue #18,
from the state files alone (each holds its recording's summary and its campaigns' facts, taken
when the step ran), or from the R3 database where an older state file lacks them."""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from corpus_recipes import RECIPES, STATE, Recipe, load_state


def recording_summary(rec: Path) -> dict[str, Any] | None:
    """What the report needs of recording.json, kept in the state so that the report holds
    after the recording itself is gone (the device machine's disk is not kept)."""
    path = rec / "recording.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    kernels = data.get("kernels", [])
    return {"kernels": len(kernels),
            "replayable": sum(any(c.get("replayable") for c in k.get("configs", []))
                              for k in kernels),
            "warnings": data.get("warnings", []), "exit_code": data.get("exit_code", 0)}


def campaign_facts(campaign_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per campaign from the R3 database (read only): which levels it searched, verified
    variants per origin, and the level of its re-timed winner."""
    db = STATE / "r3.sqlite"
    if not campaign_ids or not db.is_file():
        return {}
    from db import repository as repo
    from db.session import open_database
    from r3tui.domain import TrialConfig, VariantOrigin, VariantStatus

    good = {VariantStatus.VERIFIED, VariantStatus.IMPROVED}
    facts: dict[int, dict[str, Any]] = {}
    with open_database(db, readonly=True, create=False) as database, \
            database.session_scope() as s:
        for cid in campaign_ids:
            campaign = repo.get_campaign(s, cid)
            if campaign is None:
                continue
            recording = repo.get_recording(s, campaign.recording_id)
            recorded_block = recording.launch.block.as_tuple() if recording else None
            variants = {v.id: v for v in repo.campaign_variants(s, cid)}
            trials = repo.finished_trials(s, cid)
            source = any(variants[t.variant_id].origin is not VariantOrigin.SEED
                         for t in trials if t.variant_id in variants)
            options = {tuple(t.config.options) for t in trials}
            blocks = {(t.config.block.as_tuple() if t.config.block else recorded_block,
                       t.config.launch_bounds) for t in trials}
            yields: dict[str, list[int]] = {}
            for v in variants.values():
                if v.origin is VariantOrigin.SEED:
                    continue
                counts = yields.setdefault(v.origin.value, [0, 0])
                counts[0] += v.status in good
                counts[1] += 1
            level = None
            finals = [e.data for e in repo.events(s, cid, limit=1_000_000)
                      if e.data and e.data.get("speedup") and e.kind in ("final", "inner_done")
                      and (e.data.get("config") or e.data.get("winner"))]
            # the remix campaign's re-timed best, else the best inner search (as r3 apply)
            chosen = ([d for d in finals if "config" in d] or
                      sorted(finals, key=lambda d: float(d["speedup"]))[-1:])
            if chosen:
                data = chosen[-1]
                config = TrialConfig.from_json(data.get("config") or data["winner"])
                winner = variants.get(int(data.get("variant_id") or 0))
                parts = [p for p, on in (
                    ("source", winner is not None and winner.origin is not VariantOrigin.SEED),
                    ("compiler", bool(config.options) or bool(config.tunables)),
                    ("launch", (config.block is not None
                                and config.block.as_tuple() != recorded_block)
                     or config.launch_bounds is not None)) if on]
                level = "+".join(parts) or "original"
            facts[cid] = {"levels": {"source": source, "compiler": len(options) > 1,
                                     "launch": len(blocks) > 1},
                          "yield": yields, "best_level": level}
    return facts


def _fmt(x: float | str | None, ci: Sequence[float] | None = None) -> str:
    if x is None or isinstance(x, str):
        return x or "-"
    return f"{x:.3f}" + (f" [{ci[0]:.3f},{ci[1]:.3f}]" if ci else "")


def program_row(recipe: Recipe, state: dict[str, Any],
                facts: dict[int, dict[str, Any]]) -> dict[str, Any]:
    steps = state["steps"]
    plain, record = steps.get("plain", {}), steps.get("record", {})
    tune, apply = steps.get("tune", {}), steps.get("apply", {})
    row: dict[str, Any] = {"name": recipe.name, "recorded": record.get("status") == "ok"}
    recording = record.get("summary") or recording_summary(
        Path(record.get("recording", "/nonexistent")))
    if recording:
        row["replayable"] = f"{recording['replayable']}/{recording['kernels']}"
        warnings = " ".join(recording.get("warnings", [])).lower()
        plain_ok = plain.get("status") == "ok"
        plain_out = " ".join(plain.get("stdout_tail", [])).upper()
        rec_out = " ".join(record.get("stdout_tail", [])).upper()
        row["fault"] = plain_ok and (recording.get("exit_code", 0) != 0 or "fault" in warnings
                                     or "captur" in warnings
                                     or ("FAIL" in rec_out and "FAIL" not in plain_out))
    elif plain.get("status") == "ok" and record.get("status") == "failed":
        # no recording: a fault only where r3 says the application faulted under it
        row["fault"] = "fault" in " ".join(record.get("tail", [])).lower()
    row["wall"] = plain.get("median_wall_s")
    for name, step in (("plain run", plain), ("record", record), ("tune-app", tune),
                       ("apply", apply)):
        if step.get("status") in ("failed", "timeout"):
            last = next((ln for ln in reversed(step.get("tail", [])) if ln.strip()), "")
            row["note"] = f"{name} {step['status']}: {last.strip()[:90]}"
            break
    plan = tune.get("plan") or {}
    ids = [int(k["campaign_id"]) for k in plan.get("kernels", []) if k.get("campaign_id")]
    # the facts taken when the step ran (its database may be on a machine long gone)
    facts = {**facts, **{int(c): f for c, f in (tune.get("facts") or {}).items()}}
    mine = [facts[c] for c in ids if c in facts]
    row["levels"] = ("".join(
        letter if all(f["levels"][lv] for f in mine) else "-"
        for letter, lv in (("S", "source"), ("C", "compiler"), ("L", "launch")))
        if mine else None)
    yields: dict[str, list[int]] = {}
    for f in mine:
        for origin, (ok, total) in f["yield"].items():
            acc = yields.setdefault(origin, [0, 0])
            acc[0] += ok
            acc[1] += total
    row["yield"] = " ".join(f"{o} {a}/{b}" for o, (a, b) in sorted(yields.items())) or None
    best = max((k for k in plan.get("kernels", []) if k.get("speedup")),
               key=lambda k: k["speedup"], default=None)
    if best:
        level = facts.get(int(best["campaign_id"]), {}).get("best_level")
        row["best"] = f"{_fmt(best['speedup'], best.get('ci'))} {level or '?'}"
    bo_plan = steps.get("tune_bo", {}).get("plan") or {}
    bo = max((k["speedup"] for k in bo_plan.get("kernels", []) if k.get("speedup")),
             default=None)
    row["r3_over_bo_raw"] = best["speedup"] / bo if best and bo else None
    r3_ships, bo_ships = _shipped_interval(plan), _shipped_interval(bo_plan)
    row["r3_over_bo"] = r3_ships[0] / bo_ships[0] if r3_ships and bo_ships else None
    row["r3_vs_bo_beyond_noise"] = beyond_noise(r3_ships, bo_ships)
    row["kernel_pred"] = plan.get("predicted_kernel_speedup", plan.get("predicted_app_speedup"))
    row["wall_pred"] = plan.get("predicted_wall_speedup", "n/a" if plan else None)
    summary = apply.get("summary") or {}
    row["shipped"] = any(c.get("applied") for c in summary.get("campaigns", []))
    if row["shipped"]:  # apply's prediction is of what it shipped, not of every campaign
        row["kernel_pred"] = summary.get("predicted_kernel_speedup", row["kernel_pred"])
        row["wall_pred"] = summary.get("predicted_wall_speedup", row["wall_pred"])
        row["other_work"] = summary.get("prediction_other_work") or []
    # figures of a tree that ships nothing are of the reverted candidate: not shown as results
    measured = (summary.get("measured") or {}) if row["shipped"] else {}
    if summary and not row["shipped"] and "note" not in row:
        why = next((n for c in summary.get("campaigns", []) for n in c.get("not_applied", [])),
                   "no campaign applied anything")
        row["note"] = f"nothing shipped: {why[:110]}"
    row["kernel_meas"] = measured.get("kernel_speedup", "n/a" if measured else None)
    row["kernel_meas_ci"] = measured.get("kernel_speedup_ci")
    # the wall ratio again from apply's raw runs, by apply's own statistic, so a state stored
    # before apply said how much its interval covers is judged the same way
    from r3tui.engine.app_run import ratio

    wall = ratio(measured.get("original_wall_s", []), measured.get("patched_wall_s", []))
    row["wall_meas"] = wall.value if wall else measured.get("wall_speedup")
    row["wall_meas_ci"] = (wall.low, wall.high) if wall else measured.get("wall_speedup_ci")
    row["wall_verdict"] = wall.verdict if wall else None
    row["wall_too_few"] = bool(wall and wall.too_few)
    return row


def code_versions(states: dict[str, dict[str, Any]]) -> str:
    """Which commits the programs' steps ran: ``dec75af 16`` when one version made every
    figure; a program whose steps ran different versions counts as ``mixed``, one whose state
    predates the version being stored as ``unknown``."""
    counts: dict[str, int] = {}
    for state in states.values():
        steps = [state["steps"][name] for name in ("record", "tune", "tune_bo", "apply")
                 if name in state["steps"]]
        if not steps:
            continue
        codes = {step.get("code", "unknown") for step in steps}
        code = codes.pop() if len(codes) == 1 else "mixed"
        counts[code] = counts.get(code, 0) + 1
    return ", ".join(f"{code} {n}" for code, n in sorted(counts.items(), key=lambda c: -c[1]))



def prediction_error_lines(shipped: list[dict[str, Any]]) -> list[str]:
    """``corpus_prediction_error_pct``: the worst shipped program's measured kernel-time
    speedup against its prediction, named; where that prediction said it was uncertain (its
    replayed launch does other work than its other launches), also the worst of the others."""
    errors = sorted(((abs(r["kernel_meas"] / r["kernel_pred"] - 1) * 100, r) for r in shipped
                     if isinstance(r["kernel_meas"], float) and r["kernel_pred"]),
                    key=lambda e: e[0])
    if not errors:
        return ["corpus_prediction_error_pct: n/a (no shipped program has a measured kernel "
                "time)" if shipped else "corpus_prediction_error_pct: n/a (nothing shipped yet)"]
    worst, row = errors[-1]
    said = (f"; its prediction said it was uncertain: {row['other_work'][0]}"
            if row.get("other_work") else "")
    out = [f"corpus_prediction_error_pct: {worst:.1f}  ({row['name']}: predicted "
           f"{row['kernel_pred']:.3f}, measured {row['kernel_meas']:.3f}{said})"]
    sure = [e for e in errors if not e[1].get("other_work")]
    if said and sure:
        out.append(f"corpus_prediction_error_pct_without_uncertain: {sure[-1][0]:.1f}  "
                   f"({sure[-1][1]['name']}; the worst of the {len(sure)} shipped programs "
                   "whose prediction did not say it was uncertain)")
    return out


def report_lines() -> list[str]:
    states = {r.name: load_state(r.name) for r in RECIPES}
    ids = [int(k["campaign_id"]) for st in states.values()
           for k in (st["steps"].get("tune", {}).get("plan") or {}).get("kernels", [])
           if k.get("campaign_id") and "facts" not in st["steps"]["tune"]]
    facts = campaign_facts(ids)
    rows = [program_row(r, states[r.name], facts) for r in RECIPES]
    out = [f"# bench/corpus.py report on {platform.node()}, {time.strftime('%Y-%m-%d %H:%M')}; "
           f"state {STATE}",
           "# levels: S source, C compiler options, L launch shape (all campaigns of the "
           "program); best: re-timed winner over the recorded configuration [95% CI] and the "
           "level it came from; wall CI: r3 apply's order-statistic interval of its "
           "interleaved pairs",
           "# r3/bo: what the full campaign would ship over what BO alone would (each arm's "
           "best re-timed speedup where its interval is above 1, else 1)",
           f"{'program':<15} {'wall s':>6} {'rec':>3} {'replay':>6} {'lvl':>3}  {'yield':<22} "
           f"{'best kernel speedup':<30} {'r3/bo':>6} {'kernel pred/meas':<24} "
           f"{'wall pred/meas':<30} note"]
    if any(r["wall_pred"] == "n/a" for r in rows):
        out.append("# wall pred n/a: tune-app.json has no predicted_wall_speedup yet")
    if any(r["kernel_meas"] == "n/a" for r in rows):
        out.append("# kernel meas n/a: r3-apply.json's measured has no kernel_speedup yet")
    for r in rows:
        kernel = f"{_fmt(r['kernel_pred'])} / {_fmt(r['kernel_meas'], r['kernel_meas_ci'])}"
        wall = f"{_fmt(r['wall_pred'])} / {_fmt(r['wall_meas'], r['wall_meas_ci'])}"
        plain_wall = f"{r['wall']:6.2f}" if r.get("wall") else f"{'-':>6}"
        out.append(f"{r['name']:<15} {plain_wall} {'yes' if r['recorded'] else 'no':>3} "
                   f"{r.get('replayable') or '-':>6} {r['levels'] or '-':>3}  "
                   f"{r['yield'] or '-':<22} {r.get('best') or '-':<30} "
                   f"{_fmt(r['r3_over_bo']) if r['r3_over_bo'] else '-':>6} {kernel:<24} "
                   f"{wall:<30} {r.get('note', '')}")
    n = len(RECIPES)
    out.append(f"corpus_code_versions: {code_versions(states) or 'n/a (nothing run yet)'} "
               "(programs by the commit their steps ran)")
    out.append(f"corpus_recorded: {sum(r['recorded'] for r in rows)}/{n}")
    out.append(f"corpus_searched_all_levels: {sum(r['levels'] == 'SCL' for r in rows)}/{n}")
    recorded = [r for r in rows if "fault" in r]
    out.append(f"corpus_recording_faults_introduced: {sum(r['fault'] for r in recorded)}"
               if recorded else "corpus_recording_faults_introduced: n/a (nothing recorded yet)")
    shipped = [r for r in rows if r["shipped"]]
    judged = [r for r in shipped if r["wall_verdict"]]
    few = sum(r["wall_too_few"] for r in judged)
    out.append("corpus_regressions_shipped: "
               + (f"{sum(r['wall_verdict'] == 'slower' for r in judged)} (of {len(shipped)} "
                  "shipped; wall time slower beyond the noise"
                  + (f"; {few} measured over too few pairs for a 95% interval, so within noise"
                     if few else "") + ")" if judged
                  else "n/a (no shipped change with measured runs yet)"))
    out += prediction_error_lines(shipped)
    bests = [float(r["best"].split()[0]) for r in rows if r.get("best")]
    out.append(f"corpus_median_kernel_speedup: {statistics.median(bests):.3f}" if bests else
               "corpus_median_kernel_speedup: n/a (no tuned kernel yet)")
    ratios = [r["r3_over_bo"] for r in rows if r["r3_over_bo"]]
    if ratios:
        median = statistics.median(ratios)
        low, high = median_interval(ratios)
        verdict = "" if low > 1 or high < 1 else " within noise"
        out.append(f"corpus_r3_over_bo_only: {median:.3f} [{low:.3f}, {high:.3f}]{verdict} "
                   f"(median over {len(ratios)} programs of what each arm would ship: its "
                   "best kernel's re-timed speedup where its interval is above 1, else 1; "
                   "95% bootstrap interval over programs)")
        out.append(f"corpus_r3_over_bo_only_programs: {arm_counts(ratios)}")
        verdicts = [r["r3_vs_bo_beyond_noise"] for r in rows if r["r3_vs_bo_beyond_noise"]]
        out.append("corpus_r3_over_bo_only_beyond_noise: "
                   f"{verdicts.count('ahead')} ahead, {verdicts.count('behind')} behind, "
                   f"{verdicts.count('tied')} within noise (the arms' shipped intervals apart or "
                   "overlapping)")
        raw = [r["r3_over_bo_raw"] for r in rows if r["r3_over_bo_raw"]]
        out.append(f"corpus_r3_over_bo_only_point_estimates: {statistics.median(raw):.3f} "
                   "(the same median over the winners' point estimates, noise included)")
    else:
        out.append("corpus_r3_over_bo_only: n/a (run --stage tune-bo as well)")
    return out


def arm_counts(ratios: list[float]) -> str:
    """How many programs the full campaign would ship more for, as much, and less than BO
    alone: the median is above 1 only where more than half are ahead."""
    ahead = sum(r > 1 for r in ratios)
    behind = sum(r < 1 for r in ratios)
    return (f"{ahead} ahead, {len(ratios) - ahead - behind} tied, {behind} behind "
            f"(the median passes 1 with {len(ratios) // 2 + 1} ahead)")


def _shipped_interval(plan: dict[str, Any]) -> tuple[float, float, float] | None:
    """What an arm's campaigns would ship, as r3 apply decides, with its interval: the best
    kernel's re-timed speedup (value, low, high) among those whose interval lies above 1,
    (1, 1, 1) where it would ship nothing (the original), None where the arm did not run."""
    kernels = plan.get("kernels", [])
    if not kernels:
        return None
    beyond = [(float(k["speedup"]), float(k["ci"][0]), float(k["ci"][1])) for k in kernels
              if k.get("speedup") and k.get("ci") and float(k["ci"][0]) > 1]
    return max(beyond, default=(1.0, 1.0, 1.0))


def beyond_noise(r3: tuple[float, float, float] | None,
                 bo: tuple[float, float, float] | None) -> str | None:
    """``ahead`` where the full campaign's shipped interval lies above BO alone's, ``behind``
    where below, else ``tied``: a ratio of two winners within each other's noise is no
    difference (hotspot3D, session 44: 1.092 [1.068, 1.100] against 1.127 [1.046, 1.135])."""
    if r3 is None or bo is None:
        return None
    if r3[1] > bo[2]:
        return "ahead"
    if r3[2] < bo[1]:
        return "behind"
    return "tied"


def median_interval(values: list[float], draws: int = 2000, seed: int = 7
                    ) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median, resampling programs."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values)))
                     for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def cmd_report(args: argparse.Namespace) -> int:
    lines = report_lines()
    print("\n".join(lines))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0
