#!/usr/bin/env bash
# One GPU session on the device machine: environment probe, the GPU test suite, a summary,
# then the benchmarks named in R3_BENCH (default: eval_cost spaces inner_live, or none where
# pytest arguments are given; empty: none;
# also: bundles campaigns evaluate_llm llm_dbs app_tune verification corpus rule_gains
# multi_gpu demo_record demo_evaluate).
#
#   source .device/setup.sh && bash bench/gpu_session.sh
#
# The full log and a JUnit XML go to $OUT (the device tool copies that folder back); the
# table at the end is what the reply's output tail shows.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/r3-gpu-session}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."

{
  echo "== environment"
  # the commit that runs: R3_CODE, set by the command from the machine that sent the tree
  # (the device copy's .git may be another commit's); else .git's (+dirty: tracked changes)
  echo "code ${R3_CODE:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo +dirty)}"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader || true
  python3 - <<'PY'
import importlib.metadata as md
for name in ("cuda-bindings", "nvidia-cuda-nvrtc", "numpy", "pycuda", "pytest"):
    try:
        print(f"{name:18} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name:18} missing")
PY
} 2>&1 | tee "$OUT/environment.txt"

# a kit without the project's dependencies fails every test at import: say so once, and stop
missing=$(python3 - <<'PY'
import importlib.util
names = ("sqlalchemy", "alembic", "skopt", "textual", "tree_sitter", "tree_sitter_cuda",
         "distributed", "pycuda")
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [ -n "$missing" ]; then
  echo "gpu_session.sh: error: not importable here: $missing (run bench/device_kit.sh on the CPU machine and carry .device)" >&2
  exit 2
fi

rc=0
if [ -n "${R3_SKIP_TESTS:-}" ]; then
  echo "== GPU tests skipped (R3_SKIP_TESTS)"
else
echo "== GPU tests"
export R3_GPU_REPORT="$OUT/replay-times.jsonl"
rm -f "$R3_GPU_REPORT"
# R3_GPU_TESTS: the test paths (default tests/gpu); R3_TESTS_S: seconds for them, after which
# pytest is interrupted (SIGINT) and still writes its JUnit report and durations, so a suite
# cut short says what ran (session 48's was killed whole by the command's timeout after 80 of
# 100 tests, and said nothing of their times)
tests_s=${R3_TESTS_S:-0}
# shellcheck disable=SC2086  # R3_GPU_TESTS is a list of paths
timeout -s INT -k 30 "$tests_s" python3 -m pytest ${R3_GPU_TESTS:-tests/gpu} -m gpu -q -rs \
  -p no:cacheprovider --durations=15 -o faulthandler_timeout=240 \
  --junitxml="$OUT/gpu-junit.xml" "$@" 2>&1 | tee "$OUT/gpu-tests.log"
rc=${PIPESTATUS[0]}

python3 - "$OUT/gpu-junit.xml" <<'PY'
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as exc:
    print(f"no JUnit report: {exc}")
    raise SystemExit(0)
rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
for case in root.iter("testcase"):
    outcome = "passed"
    for tag in ("failure", "error", "skipped"):
        if case.find(tag) is not None:
            outcome = {"failure": "failed"}.get(tag, tag)
    counts[outcome] += 1
    name = case.get("name", "?")
    module = case.get("classname", "").rsplit(".", 1)[-1]
    rows.append((f"{module}::{name}", outcome, float(case.get("time", 0))))
print()
print(f"{'test':78} {'outcome':8} {'s':>7}")
print("-" * 95)
for name, outcome, seconds in rows:
    print(f"{name[:78]:78} {outcome:8} {seconds:7.2f}")
print("-" * 95)
print("  ".join(f"{k}={v}" for k, v in counts.items()),
      f" total={sum(r[2] for r in rows):.1f}s")
PY
python3 - "$R3_GPU_REPORT" <<'PY'
import json
import sys

try:
    rows = [json.loads(line) for line in open(sys.argv[1])]
except OSError:
    raise SystemExit(0)
print()
print("replay of the recorded examples (µs, median; ratio = replayed original / recorder's baseline)")
print(f"{'example':11} {'block':12} {'baseline':>9} {'replay':>9} {'ratio':>6} {'recompiled':>10} "
      f"{'n':>4} {'wall ms':>8} {'MB':>7} {'flush':>5}")
for r in rows:
    if "baseline_us" not in r:
        continue
    ratio = r["original_us"] / r["baseline_us"] if r["baseline_us"] else float("nan")
    print(f"{r['name']:11} {'x'.join(map(str, r['block'])):12} {r['baseline_us']:9.2f} "
          f"{r['original_us']:9.2f} {ratio:6.3f} {r['recompiled_us']:10.2f} {r['samples']:4d} "
          f"{r['replay_wall_ms']:8.1f} {r['working_set_mb']:7.1f} {str(r['l2_flush']):>5}")
for r in rows:
    if "baseline_us" not in r:
        print(f"{r['name']:11} {'x'.join(map(str, r['block'])):12} {'':9} {r['median_us']:9.2f}"
              "  (other block shape)")
PY
fi
# R3_BENCH: which benchmarks to run after the tests (default: eval_cost spaces inner_live;
# none when pytest arguments select tests, as `-k test_gpu_tune` does: session 34's call with
# them and no R3_BENCH spent 350 s of its 600 on the default benchmarks it did not ask for)
if [ $# -gt 0 ]; then default_bench=""; else default_bench="eval_cost spaces inner_live"; fi
bench=" ${R3_BENCH-$default_bench} "
run_bench() {  # name, then the command; the log goes to $OUT/<name>.log
  local name=$1; shift
  echo "== benchmark: $name"
  "$@" 2>&1 | tee "$OUT/$name.log"
  local brc=${PIPESTATUS[0]}
  [ "$brc" -eq 0 ] || rc=$brc
}
case $bench in *" eval_cost "*)
  # issue #21: candidates/s through the local runner (and the Dask runner: --dask), GPU busy
  run_bench eval_cost python3 bench/eval_cost.py --out "$OUT/eval_cost.txt" \
    ${R3_EVAL_COST_ARGS:---dask};; esac
case $bench in *" rule_gains "*)
  # issue #19: each rule's variants of the examples re-timed against the original alone
  run_bench rule_gains python3 bench/rule_gains.py --scale "${R3_RULES_SCALE:-1.0}" \
    --examples "${R3_RULES_EXAMPLES:-reduce_sum,softmax,sgemm,stencil7,spmv_csr,nbody}" \
    --rules "${R3_RULES_ONLY:-}" --blocks "${R3_RULES_BLOCKS:-}" --values "${R3_RULES_VALUES:-}" \
    ${R3_RULES_CARVEOUT:+--carveout "$R3_RULES_CARVEOUT"};; esac
case $bench in *" spaces "*)
  run_bench spaces python3 bench/record_spaces.py --out "$OUT/spaces"
  (cd "$OUT" && tar czf spaces.tgz spaces && rm -rf spaces);; esac
case $bench in *" verification "*)
  # issue #17: adversarial kernels caught, and what the checks cost
  run_bench verification python3 bench/verification.py --out "$OUT/verification.txt" \
    ${R3_VERIFICATION_ARGS:-};; esac
case $bench in *" corpus "*)
  # issue #18: every stage of each program back to back (record, tune, tune --inner-only,
  # apply), so a program finished here needs nothing of this machine again; carry
  # bench/work/corpus and, to resume, bench/work/corpus-state after `corpus.py import`.
  # R3_CORPUS_ONLY limits the programs, R3_CORPUS_FORCE=1 redoes them from the recording on
  # (after a fix to recording); the state comes back as $OUT/corpus-state.tgz.
  only=${R3_CORPUS_ONLY:+--only $R3_CORPUS_ONLY}
  force=${R3_CORPUS_FORCE:+--force}
  run_bench corpus_prepare python3 bench/corpus.py prepare --build-only $only
  run_bench corpus_all python3 bench/corpus.py run --stage all $only $force --plain-runs 2 \
    --budget "${R3_CORPUS_BUDGET:-8s}" --top 1 --max-runs "${R3_CORPUS_MAX_RUNS:-10}" \
    --deadline-s "${R3_CORPUS_S:-480}" --tune-args="--rules-only" \
    --record-args="--max-snapshot-bytes ${R3_CORPUS_SNAPSHOTS:-3G} --max-configs 6" --strata "${R3_CORPUS_STRATA:-0}" \
    --strata-snapshots "${R3_CORPUS_STRATA_SNAPSHOTS:-6G}" \
    --export "$OUT";; esac
case $bench in *" inner_live "*)
  run_bench inner_live python3 bench/inner_live.py --db "$OUT/inner-live.sqlite";; esac
case $bench in *" bundles "*)
  # small recordings, for generating LLM variants on the CPU machine (one archive each:
  # the device tool brings back files of up to 16 MiB)
  run_bench bundles python3 -c "
import sys; sys.path[:0] = ['bench', 'examples']
from pathlib import Path
from campaigns import record
out = Path('$OUT/bundles'); out.mkdir(exist_ok=True)
for name in '${R3_BUNDLE_EXAMPLES:-stencil7,softmax,reduce_sum}'.split(','):
    print(name, record(name, out, ${R3_BUNDLE_SCALE:-0.05}))
"
  (cd "$OUT/bundles" && for b in *.r3b; do tar czf "../bundle-${b%.r3b}.tgz" "$b"; done)
  rm -rf "$OUT/bundles"; ls -la "$OUT"/bundle-*.tgz;; esac
case $bench in *" campaigns "*)
  # R3_CAMPAIGNS_DB: an earlier call's database, carried: its finished seeds are not run again
  if [ -n "${R3_CAMPAIGNS_DB:-}" ] && [ -f "$R3_CAMPAIGNS_DB" ]; then
    cp "$R3_CAMPAIGNS_DB" "$OUT/campaigns.sqlite"
  fi
  run_bench campaigns timeout "${R3_CAMPAIGNS_TIMEOUT:-400}" python3 bench/campaigns.py \
    --db "$OUT/campaigns.sqlite" ${R3_CAMPAIGNS_ARGS:-};; esac
case $bench in *" evaluate_llm "*)
  mkdir -p /tmp/r3-bundles && for f in bench/work/bundle-*.tgz; do
    tar xzf "$f" -C /tmp/r3-bundles; done
  cp bench/work/llm.sqlite "$OUT/llm.sqlite"
  run_bench evaluate_llm python3 bench/campaigns.py --evaluate-db "$OUT/llm.sqlite" \
    --bundles /tmp/r3-bundles
  # and one rules-only campaign deep enough to show a tree (the demo database)
  run_bench demo_campaign python3 -m r3tui tune /tmp/r3-bundles/stencil7.r3b --rules-only \
    --budget "${R3_DEMO_VARIANTS:-16}" --inner-budget 6 --seed-budget 16 \
    --db "$OUT/llm.sqlite" --name stencil7-rules
  python3 -m r3tui report "$(python3 -c "
import sqlite3; print(sqlite3.connect('$OUT/llm.sqlite').execute('select max(id) from campaigns').fetchone()[0])")" \
    --db "$OUT/llm.sqlite" | tee "$OUT/demo_report.log";; esac
case $bench in *" llm_dbs "*)
  # generate-only databases made on the CPU machine (R3_LLM_DBS: a carried folder of
  # <model>-<example>.sqlite files, in subfolders or not), each evaluated against the demo's
  # recording of its example; they come back as one tar, $OUT/llm_dbs.tgz (a call brings back
  # a few files only: session 39 lost 14 of 22), with the yields printed
  rm -rf /tmp/r3-llm-dbs && mkdir -p /tmp/r3-llm-dbs
  cp -r "${R3_LLM_DBS:?R3_LLM_DBS: the folder of databases}/." /tmp/r3-llm-dbs/
  find /tmp/r3-llm-dbs -name '*.sqlite' | sort | while read -r db; do
    e=$(basename "$db" .sqlite); e=${e#*-}
    if [ ! -d "examples/demo/bundles/$e.r3b" ]; then
      echo "$db: no recording of $e in examples/demo/bundles"; continue; fi
    timeout -k 5 "${R3_LLM_DB_TIMEOUT:-60}" python3 -m r3tui evaluate --db "$db" \
      --bundle "examples/demo/bundles/$e.r3b" > "${db%.sqlite}.evaluate.log" 2>&1
    echo "$db: rc=$? $(tail -1 "${db%.sqlite}.evaluate.log" | cut -c1-140)"
  done | tee "$OUT/llm_dbs.log"
  run_bench llm_yields python3 bench/llm_generate.py $(find /tmp/r3-llm-dbs -name '*.sqlite' | sort)
  (cd /tmp && tar czf "$OUT/llm_dbs.tgz" r3-llm-dbs);; esac
case $bench in *" demo_record "*)
  # issue #20, step 1 of bench/make_demo.py: the small recordings and the rules campaign; the
  # folder comes back as $OUT/demo.tgz (a bundle is many files)
  run_bench demo_record python3 bench/make_demo.py record --out "$OUT/demo" ${R3_DEMO_ARGS:-}
  (cd "$OUT" && tar czf demo.tgz demo && rm -rf demo);; esac
case $bench in *" demo_evaluate "*)
  # step 3: the model's pending proposals (made on the CPU machine into examples/demo)
  # evaluated
  run_bench demo_evaluate python3 bench/make_demo.py evaluate --folder examples/demo \
    --out "$OUT/demo"
  (cd "$OUT" && tar czf demo.tgz demo && rm -rf demo);; esac
case $bench in *" multi_gpu "*)
  # issue #22: one campaign on 1 GPU and on every visible one, local and Dask runners
  run_bench multi_gpu python3 bench/multi_gpu.py --out "$OUT/multi_gpu.txt" \
    ${R3_MULTI_GPU_ARGS:-};; esac
case $bench in *" app_tune "*)
  # the CG application recorded, tuned, applied and re-measured (issue #7)
  run_bench app_tune python3 bench/app_tune.py --work /tmp/r3app --out "$OUT/app_tune.txt" \
    ${R3_APP_ARGS:---n 192 --budget 6 --top 2 --record-runs 1 --runs 3 --reachable};; esac
if [ -n "${R3_PACK:-}" ]; then
  # the device tool brings back at most 8 files: logs in one archive, databases checkpointed
  for db in "$OUT"/*.sqlite; do
    [ -e "$db" ] && python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('pragma wal_checkpoint(TRUNCATE)')" "$db"
  done
  rm -f "$OUT"/*.sqlite-wal "$OUT"/*.sqlite-shm
  (cd "$OUT" && tar czf logs.tgz --remove-files $(ls *.log *.txt *.xml *.jsonl 2>/dev/null))
  ls -la "$OUT"
fi
exit "$rc"
