"""A recording resident on one GPU: the arena mapped at its recorded addresses, a pristine
device copy of the prologue, the epilogue on the device, and candidates evaluated against them.

The recorded launch and the recording's check launches (other inputs, never timed) live in the
arena side by side.  How a candidate is verified so that it cannot game the timing -- the
timed launches verified too, module variables reset before every launch, check launches --
is :class:`~r3tui.replay.verify.CheckPolicy`, explained in ``docs/verification.md``.

This runs inside the replay worker process (:mod:`r3tui.replay.worker`); a sticky CUDA error
sets :attr:`ResidentBundle.poisoned` and the worker is replaced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from r3tui.cuda import driver as cu
from r3tui.cuda.arena import Arena
from r3tui.domain import Dim3, Measurement, MeasurementStatus, ResourceUsage, Tolerance
from r3tui.record.bundle import Bundle
from r3tui.record.manifest import AllocationInfo, GlobalInfo, Manifest
from r3tui.replay.candidate import Candidate
from r3tui.replay.device_verify import DeviceComparator
from r3tui.replay.timing import (
    EventTimer,
    L2Flush,
    L2Regime,
    TimingPolicy,
    choose_l2,
    time_launches,
)
from r3tui.replay.verify import (
    ORDER_CAP,
    CheckPolicy,
    Comparison,
    compare_host,
    order_dependence,
    worst,
)


@dataclass
class _Loaded:
    module: Any
    function: Any
    layout: list[tuple[int, int]]
    globals: dict[str, tuple[int, int]]  # name -> (address, size) in this module
    # Every other variable of the module with a device copy of its load-time bytes:
    # (address, size, copy address), put back before every launch.
    state: list[tuple[int, int, int]]


@dataclass(frozen=True)
class _Case:
    """A launch to verify against: the recorded one, or a check launch."""

    label: str
    allocations: tuple[AllocationInfo, ...]
    globals: tuple[GlobalInfo, ...]
    pristine: int  # device image of the whole extent before the launch
    # what a restore copies from it, (offset, bytes): the whole extent for the recorded
    # launch, only its own buffers' span for a check launch that shares the image (the next
    # restore of the recorded launch resets everything before any timed launch)
    span: tuple[int, int]
    expected: dict[str, int]  # allocation name -> device address of its epilogue
    global_prologue: dict[str, bytes]
    global_epilogue: dict[str, bytes]


class _Wrong(Exception):
    """A verification failed; the message says which launch and which buffers, ``case``
    which launch it was (None: a layout problem, before any launch)."""

    def __init__(self, text: str, worst_cmp: Comparison | None, case: _Case | None = None):
        super().__init__(text, worst_cmp)
        self.case = case


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _disjoint(allocations: tuple[AllocationInfo, ...]) -> bool:
    end = 0
    for a in sorted(allocations, key=lambda a: a.address):
        if a.address < end:
            return False
        end = a.address + a.size
    return True


class ResidentBundle:
    def __init__(self, bundle: Bundle, device: int = 0,
                 policy: TimingPolicy = TimingPolicy(),
                 checks: CheckPolicy = CheckPolicy()) -> None:
        self.bundle = bundle
        self.manifest: Manifest = bundle.manifest
        self.policy = policy
        self.checks = checks
        self.poisoned = False
        self.ctx = cu.PrimaryContext(device)
        m = self.manifest
        every = m.all_allocations
        # the guard after the last allocation too (arena.guard, 0 in bundles without one): a
        # kernel that read a little past it while recording reads zeros here as it did there
        self.extent = _round_up(max((a.address + a.size - m.arena.base for a in every),
                                    default=0) + m.arena.guard, 256)
        # The fixed range first, before anything else in this process takes address space.
        # At least the recording's 64 GiB: on the H200 (2026-12-04) a reservation of only the
        # extent (a few MiB) was placed elsewhere every time, where 64 GiB at the base held
        # in most processes (ReplayWorker.start restarts a child whose range was taken).
        self.arena = Arena(max(self.extent, 1), base=m.arena.base, device=device)
        # every launch of this bundle's kernel, candidates too, as the application launched it
        self.cooperative = m.launch.cooperative
        drv = cu.driver()
        self.info = cu.device_info(self.ctx.device)
        self.stream = cu.check(
            drv.cuStreamCreate(drv.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self.arena.map_extent(max(self.extent, 1))
        for a in every:
            self.arena.place(a.name, a.address, a.size)
        self._buffers: list[int] = []
        # One pristine and one expected image of the whole extent per group of launches whose
        # buffers do not overlap: all of them for `r3 record kernel` (its check launches lie
        # apart), one per launch for an application's (the same buffers, other contents).
        # The epilogue of an allocation the kernel does not change is its prologue: compared
        # against the pristine image instead of being stored twice.
        launches = [("recorded launch", m.allocations, m.globals)] + [
            (f"check launch ({c.label})", c.allocations, c.globals) for c in m.checks]
        shared = _disjoint(every)
        groups = [list(range(len(launches)))] if shared else [[k] for k in range(len(launches))]
        images: dict[int, tuple[int, int]] = {}
        for group in groups:
            members = [a for k in group for a in launches[k][1]]
            pristine = self._image(members, "prologue")
            changed = [a for a in members if a.epilogue != a.prologue]
            expected = self._image(changed, "epilogue") if changed else pristine
            images.update({k: (pristine, expected) for k in group})

        def case(k: int) -> _Case:
            label, allocations, globals_ = launches[k]
            pristine, expected = images[k]
            span = (0, self.extent)
            if k and shared and allocations:
                lo = min(a.address for a in allocations) - m.arena.base
                hi = max(a.address + a.size for a in allocations) - m.arena.base
                span = (lo, hi - lo)
            return _Case(
                label, allocations, globals_, pristine, span,
                {a.name: (expected if a.epilogue != a.prologue else pristine)
                 + a.address - m.arena.base for a in allocations},
                {g.name: bundle.blob(g.prologue) for g in globals_},
                {g.name: bundle.blob(g.epilogue) for g in globals_},
            )

        self.main = case(0)
        self.cases = [case(k) for k in range(1, len(launches))]
        self.flush = (L2Flush(self.info.l2_bytes, self.stream)
                      if policy.l2_flush and m.working_set_bytes < 2 * self.info.l2_bytes
                      else None)
        self.comparator = DeviceComparator(self.info.arch, self.info.sm_count, self.stream)
        self.timer = EventTimer(self.stream)
        self._loaded: dict[tuple[str, str], _Loaded] = {}
        self._results: dict[tuple[object, ...], Measurement] = {}
        self.launches = 0
        # wall time spent in the defences beyond the first verification (check launches,
        # verifying the timed launches): what bench/verification.py reports they cost
        self.defence_s = 0.0
        # float buffers whose recorded result depends on the order of the kernel's float
        # operations (_probe_order), by (launch, buffer), with the tolerance they are verified
        # with instead; the launches probed so far (each at most once)
        self._order: dict[tuple[str, str], Tolerance] = {}
        self.order_notes: tuple[str, ...] = ()
        self._probed: set[str] = set()
        self.l2_note = ""
        # the hot regime (L2Regime.HOT): the launch's span read after every restore
        self.touch = False
        # the primed regime (L2Regime.PRIMED): the recorded binary's launch, untimed, before
        # each timed one, then what it wrote restored (_prepare); None in the others
        self.prime: tuple[_Loaded, Callable[[], None]] | None = None
        # the arena ranges (offset, bytes) the recorded launch writes: its allocations whose
        # epilogue is not their prologue
        self._written = [(a.address - m.arena.base, a.size) for a in self.main.allocations
                         if a.epilogue != a.prologue]
        if policy.reference_s and self.flush is not None:
            self._calibrate_l2(policy.reference_s)

    @property
    def l2_regime(self) -> L2Regime:
        """What L2 holds when a timed launch starts."""
        if self.flush is not None:
            return L2Regime.COLD
        if self.prime is not None:
            return L2Regime.PRIMED
        return L2Regime.HOT if self.touch else L2Regime.WARM

    @property
    def measured(self) -> int:
        """Distinct (binary, launch) pairs measured so far."""
        return len(self._results)

    def _alloc(self, size: int) -> int:
        drv = cu.driver()
        ptr = int(cu.check(drv.cuMemAlloc(max(size, 256)), "cuMemAlloc"))
        self._buffers.append(ptr)
        return ptr

    def _image(self, allocations: list[AllocationInfo], which: str) -> int:
        """A device image of the whole extent holding these allocations' prologues or
        epilogues at their offsets, zero elsewhere (gaps are restored too)."""
        image = self._alloc(self.extent)
        if self.extent:
            cu.check(cu.driver().cuMemsetD8(image, 0, self.extent), "cuMemsetD8")
        for a in allocations:
            cu.copy_to_device(image + a.address - self.manifest.arena.base,
                              self.bundle.blob(getattr(a, which)))
        return image

    # -- candidate pieces ----------------------------------------------------------------
    def _load(self, c: Candidate) -> _Loaded:
        key = (c.binary_sha256, c.lowered_name)
        if key not in self._loaded:
            module = cu.load_module(c.binary)
            function = cu.get_function(module, c.lowered_name)
            globals_: dict[str, tuple[int, int]] = {}
            for g in self.manifest.globals:
                found = cu.module_global(module, g.name)
                if found is not None and found[1] == g.size:
                    globals_[g.name] = found
            # the L1/shared split the application set for this kernel, for every binary
            # replayed: the original and each candidate run with the split it ran with
            launch = self.manifest.launch
            cu.set_cache_split(function, launch.cache_config, launch.carveout)
            loaded = _Loaded(module, function, cu.param_layout(function), globals_, [])
            self._loaded[key] = loaded
            if self.checks.reset_module_state:
                self._snapshot_state(c.binary, loaded)
        return self._loaded[key]

    def _snapshot_state(self, binary: bytes, loaded: _Loaded) -> None:
        """Keep a device copy of every module variable the recording does not restore."""
        from r3tui.compile.cubin import Cubin, CubinError

        try:
            variables = Cubin.parse(binary).module_variables()
        except CubinError:
            return  # PTX or a fatbin (a recorded original): R³'s candidates are cubins
        drv = cu.driver()
        for name, _size in variables:
            if name in loaded.globals:
                continue  # restored from the recording's prologue
            found = cu.module_global(loaded.module, name)
            if found is None:
                continue
            address, size = found
            copy = self._alloc(size)
            cu.check(drv.cuMemcpyDtoD(copy, address, size), "cuMemcpyDtoD")
            loaded.state.append((address, size, copy))

    def restore(self, loaded: _Loaded | None = None, case: _Case | None = None) -> None:
        """Put the prologue back (device to device): the arena, the recorded globals and the
        module's own variables; then flush L2 if it would hold the working set."""
        drv = cu.driver()
        case = case or self.main
        offset, size = case.span
        if size:
            cu.check(drv.cuMemcpyDtoDAsync(self.manifest.arena.base + offset,
                                           case.pristine + offset, size, self.stream),
                     "cuMemcpyDtoDAsync")
        if loaded is not None:
            self._restore_module(loaded, case)
        if self.flush is not None:
            self.flush()
        elif self.touch and size:
            # read-only: the kernel starts from the prologue just restored, L2 holding it
            self.comparator.touch(self.manifest.arena.base + offset, size)

    def _restore_module(self, loaded: _Loaded, case: _Case) -> None:
        """The recorded globals and the module's own variables of ``loaded`` put back."""
        drv = cu.driver()
        for name, (address, _size) in loaded.globals.items():
            data = case.global_prologue[name]
            cu.check(drv.cuMemcpyHtoDAsync(address, data, len(data), self.stream),
                     "cuMemcpyHtoDAsync")
        for address, size, copy in loaded.state:
            cu.check(drv.cuMemcpyDtoDAsync(address, copy, size, self.stream),
                     "cuMemcpyDtoDAsync")

    def _prepare(self, loaded: _Loaded) -> None:
        """What comes before every timed launch of ``loaded``: the restore; in the primed
        regime, first the restore and an untimed launch of the recorded binary, then what
        that launch wrote and ``loaded``'s module state restored.  The memory the timed
        launch starts from is the prologue in every regime (:meth:`_primed_is_prologue`);
        no code of the candidate runs before it, so it cannot profit from a launch of its
        own."""
        if self.prime is None:
            self.restore(loaded)
            return
        original, launch = self.prime
        self.restore(original)
        launch()
        drv = cu.driver()
        base = self.manifest.arena.base
        for offset, size in self._written:
            cu.check(drv.cuMemcpyDtoDAsync(base + offset, self.main.pristine + offset, size,
                                           self.stream), "cuMemcpyDtoDAsync")
        self._restore_module(loaded, self.main)

    def _primed_is_prologue(self, loaded: _Loaded) -> bool:
        """Whether the primed regime's preparation leaves the arena exactly as the restore
        does (the recorded launch writes only the allocations it changed): only then is it
        offered."""
        self._prepare(loaded)
        cu.check(cu.driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        offset, size = self.main.span
        if not size:
            return True
        base = self.manifest.arena.base
        first, _ = self.comparator.first_difference(base + offset, self.main.pristine + offset,
                                                    size)
        return first is None

    def _check_layout(self, loaded: _Loaded, args: bytes) -> str | None:
        recorded = [(p.offset, p.size) for p in self.manifest.params]
        if self.manifest.params and [s for _, s in loaded.layout] != [s for _, s in recorded]:
            return (f"the candidate's parameters ({[s for _, s in loaded.layout]} bytes) do not "
                    f"match the recording's ({[s for _, s in recorded]} bytes)")
        end = max((o + s for o, s in loaded.layout), default=0)
        if end > len(args):
            return f"the candidate's parameters need {end} bytes; the arguments hold {len(args)}"
        return None

    def verify(self, loaded: _Loaded, case: _Case | None = None) -> list[Comparison]:
        case = case or self.main
        out = [
            self.comparator.compare(a.address, case.expected[a.name], a.size,
                                    self._order.get((case.label, a.name), a.tolerance), a.dtype,
                                    buffer=a.name)
            for a in case.allocations
        ]
        for g in case.globals:
            if g.name not in loaded.globals:
                continue
            address, size = loaded.globals[g.name]
            out.append(compare_host(cu.copy_to_host(address, size), case.global_epilogue[g.name],
                                    None, None, buffer=f"global {g.name}"))
        return out

    def _verify_or_raise(self, loaded: _Loaded, case: _Case, what: str) -> list[Comparison]:
        """Synchronize, verify the arena against ``case``; :class:`_Wrong` names what failed."""
        cu.check(cu.driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        comparisons = self.verify(loaded, case)
        bad = [x for x in comparisons if not x.passed]
        if bad:
            raise _Wrong(f"{what}: " + "; ".join(x.describe() for x in bad[:4]),
                         worst(comparisons), case)
        return comparisons

    def _recorded_launch(self, case: _Case) -> tuple[_Loaded, Callable[[], None]] | None:
        """The recorded binary loaded and ready to launch on ``case`` (the recorded launch or
        a check launch); None without a binary, or where it cannot take that launch."""
        binary = self.bundle.binary()
        if binary is None:
            return None
        original = Candidate(binary, self.manifest.kernel.entry_point)
        loaded = self._load(original)
        resolved: tuple[Dim3, Dim3, int, bytes] | None
        if case is self.main:
            resolved = original.resolve(self.manifest)
        else:
            resolved = original.resolve_check(self.manifest.checks[self.cases.index(case)])
        if resolved is None:
            return None
        grid, block, shm, args = resolved
        if self._check_layout(loaded, args):
            return None
        cu.allow_dynamic_shared(loaded.function, shm)
        params = cu.KernelParams(args, loaded.layout)

        def launch() -> None:
            cu.launch(loaded.function, grid.as_tuple(), block.as_tuple(), shm, self.stream,
                      params, self.cooperative)

        return loaded, launch

    def _probe_order(self, case: _Case) -> bool:
        """Once per launch, after its verification failed: replay the recorded binary on that
        launch (the recorded one or a check launch) twice and see which float buffers differ
        between the recording and those runs while every other buffer matches exactly.  Each
        one whose spread is rounding (verify.order_dependence) is verified from then on with
        a tolerance sized from it; otherwise nothing changes.  True when tolerances were
        added (HeCBench jacobi: its recorded launch replayed bit for bit, its check launch
        did not)."""
        self._probed.add(case.label)
        floats = {a.name: a for a in case.allocations
                  if a.tolerance is None and a.dtype in ORDER_CAP and a.epilogue != a.prologue}
        ready = self._recorded_launch(case) if floats else None
        if ready is None:
            return False
        loaded, launch = ready
        runs: dict[str, list[bytes]] = {name: [] for name in floats}
        for _ in range(2):
            self.restore(loaded, case)
            launch()
            cu.check(cu.driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")
            if any(not x.passed and x.buffer not in floats for x in self.verify(loaded, case)):
                return False  # another buffer differs too: not a matter of float order
            for name, a in floats.items():
                runs[name].append(cu.copy_to_host(a.address, a.size))
        found = [order_dependence(name, str(a.dtype), self.bundle.blob(a.epilogue), runs[name])
                 for name, a in floats.items()]
        seen = [f for f in found if f is not None]
        where = "" if case is self.main else f" ({case.label})"
        self.order_notes += tuple(f.describe() + where for f in seen)
        if seen and all(f.tolerance is not None for f in seen):
            self._order.update({(case.label, f.buffer): f.tolerance
                                for f in seen if f.tolerance is not None})
            return True
        return False

    def _calibrate_l2(self, reference_s: float) -> None:
        """Time the recorded binary cold, warm, hot and primed (where :meth:`_primed_is_prologue`)
        and keep the L2 regime whose time is nearest the application's own
        (:func:`choose_l2`); a bundle without a binary stays cold."""
        ready = self._recorded_launch(self.main)
        if ready is None:
            return
        loaded, launch = ready
        flush = self.flush
        quick = replace(self.policy, max_seconds=0.5)
        cold = time_launches(launch, lambda: self.restore(loaded), self.timer, quick)
        self.flush = None
        warm = time_launches(launch, lambda: self.restore(loaded), self.timer, quick)
        self.touch = True
        hot = time_launches(launch, lambda: self.restore(loaded), self.timer, quick)
        self.touch = False
        primed_s = None
        self.prime = (loaded, launch)
        if self._primed_is_prologue(loaded):
            primed_s = time_launches(launch, lambda: self._prepare(loaded), self.timer,
                                     quick).median_s
        regime, self.l2_note = choose_l2(reference_s, cold.median_s, warm.median_s,
                                         hot.median_s, primed_s)
        self.flush = flush if regime is L2Regime.COLD else None
        self.touch = regime is L2Regime.HOT
        if regime is not L2Regime.PRIMED:
            self.prime = None
        if self.flush is None and flush is not None:
            flush.close()  # its scratch (twice the L2) is not needed again

    def _resources(self, c: Candidate, loaded: _Loaded) -> ResourceUsage:
        if c.resources.registers is not None:
            return c.resources
        attr = cu.function_attribute
        fn = loaded.function
        return ResourceUsage(
            registers=attr(fn, "CU_FUNC_ATTRIBUTE_NUM_REGS"),
            shared_mem_bytes=attr(fn, "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
            local_mem_bytes=attr(fn, "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES"),
            max_threads_per_block=attr(fn, "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
        )

    # -- evaluation ----------------------------------------------------------------------
    def evaluate(self, c: Candidate, *, timed: bool = True) -> Measurement:
        """Verify, then time, one candidate; failures come back as statuses.

        Verification runs first so a wrong candidate costs one launch, not a timing loop;
        every launch starts from the restored prologue, so the order changes no result.
        """
        key = (*c.launch_key(self.manifest), timed)
        began = time.perf_counter()
        if key in self._results:
            # the same binary at the same launch (two option sets that compile alike): the
            # result stands, and this candidate cost the GPU nothing
            return replace(self._results[key], replay_wall_s=time.perf_counter() - began)
        base = Measurement(MeasurementStatus.OK, binary_sha256=c.binary_sha256,
                           compile_time_s=c.compile_time_s, compile_log=c.compile_log,
                           resources=c.resources)
        grid, block, shm, args = c.resolve(self.manifest)
        stage = "load"
        try:
            loaded = self._load(c)
            base = replace(base, resources=self._resources(c, loaded))
            problem = self._check_layout(loaded, args)
            if problem:
                return self._done(key, replace(base, status=MeasurementStatus.LAUNCH_ERROR,
                                               error_text=problem), began)
            cu.allow_dynamic_shared(loaded.function, shm)
            params = cu.KernelParams(args, loaded.layout)

            def launch() -> None:
                cu.launch(loaded.function, grid.as_tuple(), block.as_tuple(), shm, self.stream,
                          params, self.cooperative)
                self.launches += 1

            stage = "launch"
            self.restore(loaded)
            launch()
            stage = "run"
            cu.check(cu.driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")
            stage = "verify"
            comparisons = self._verify_or_raise(loaded, self.main, self.main.label)
            worst_cmp = worst(comparisons)
            max_error = worst_cmp.max_error if worst_cmp else 0.0
            if self.checks.check_launches:
                stage = "check"
                started = time.perf_counter()
                self._verify_checks(c, loaded)
                self.defence_s += time.perf_counter() - started
            stats = None
            if timed:
                stage = "time"
                stats = time_launches(launch, lambda: self._prepare(loaded), self.timer,
                                      self.policy)
                started = time.perf_counter()
                if self.checks.verify_timed:
                    # the arena holds what the last timed launch wrote
                    self._verify_or_raise(loaded, self.main, "the last timed launch")
                spread = stats.iqr_s / stats.median_s if stats.median_s > 0 else 0.0
                if spread > self.checks.unsettled_iqr:
                    for k in range(self.checks.unsettled_verifications):
                        self.restore(loaded)
                        launch()
                        self._verify_or_raise(
                            loaded, self.main,
                            f"launch {k + 1} after timing that did not settle (IQR "
                            f"{spread:.0%} of the median)")
                self.defence_s += time.perf_counter() - started
            return self._done(key, replace(base, time=stats, verified=True,
                                           max_error=max_error, notes=self.order_notes), began)
        except _Wrong as wrong:
            case = wrong.case
            if (stage in ("verify", "check") and case is not None
                    and case.label not in self._probed):
                added = False
                try:
                    added = self._probe_order(case)
                except cu.CudaError as exc:  # the recorded binary faulted: say what failed
                    self.poisoned = self.poisoned or exc.sticky
                if added and not self.poisoned:
                    # again, with the tolerance; bounded: each launch is probed once
                    return self.evaluate(c, timed=timed)
            text, worst_cmp = wrong.args
            if self.order_notes:
                text = f"{text}; {'; '.join(self.order_notes)}"
            return self._done(key, replace(
                base, status=MeasurementStatus.WRONG_RESULT, verified=False,
                max_error=worst_cmp.max_error if worst_cmp else None, error_text=text), began)
        except cu.CudaError as exc:
            if exc.sticky:
                self.poisoned = True
            status = (MeasurementStatus.CRASHED
                      if exc.sticky or stage in ("run", "verify", "check", "time")
                      else MeasurementStatus.LAUNCH_ERROR)
            return self._done(key, replace(base, status=status, error_text=f"{stage}: {exc}"),
                              began, cache=not self.poisoned)

    def _verify_checks(self, c: Candidate, loaded: _Loaded) -> None:
        """Launch the candidate on every check launch's inputs and verify each."""
        for check, case in zip(self.manifest.checks, self.cases, strict=True):
            resolved = c.resolve_check(check)
            if resolved is None:
                continue
            grid, block, shm, args = resolved
            problem = self._check_layout(loaded, args)
            if problem:
                raise _Wrong(f"{case.label}: {problem}", None)
            cu.allow_dynamic_shared(loaded.function, shm)
            params = cu.KernelParams(args, loaded.layout)
            self.restore(loaded, case)
            cu.launch(loaded.function, grid.as_tuple(), block.as_tuple(), shm, self.stream,
                      params, self.cooperative)
            self.launches += 1
            self._verify_or_raise(loaded, case, case.label)

    def interleaved(self, candidates: list[Candidate], rounds: int) -> list[list[float]]:
        """Time already-verified candidates in interleaved rounds; seconds per candidate.

        Each round launches every candidate once, in an order rotated from round to round,
        so clock and thermal drift fall on all of them alike: this is what a winner is
        declared from, against the baseline among them.
        """
        launchers: list[tuple[_Loaded, Callable[[], None]]] = []
        resolved = [(self._load(c), c.resolve(self.manifest)) for c in candidates]
        # candidates of one binary at several sizes of dynamic shared memory (a tiled variant's
        # points) share its function, whose limit is one attribute: the largest of them, or
        # each launch above the limit another one set would fail (sgemm, session 44: the
        # campaign stopped with CUDA_ERROR_INVALID_VALUE in re-timing)
        most: dict[int, tuple[_Loaded, int]] = {}
        for loaded, (_, _, shm, _) in resolved:
            before = most.get(id(loaded), (loaded, 0))[1]
            most[id(loaded)] = (loaded, max(before, shm))
        for loaded, shm in most.values():
            cu.allow_dynamic_shared(loaded.function, shm)
        for loaded, (grid, block, shm, args) in resolved:
            params = cu.KernelParams(args, loaded.layout)

            def launch(f: Any = loaded.function, g: Dim3 = grid, b: Dim3 = block,
                       m: int = shm, p: Any = params) -> None:
                cu.launch(f, g.as_tuple(), b.as_tuple(), m, self.stream, p, self.cooperative)
                self.launches += 1

            launchers.append((loaded, launch))
        samples: list[list[float]] = [[] for _ in candidates]
        count = len(launchers)
        for r in range(-1, rounds):  # round -1 warms every candidate up, untimed
            for k in range(count):
                i = (k + max(r, 0)) % count
                loaded, run = launchers[i]
                self._prepare(loaded)
                elapsed = self.timer.time(run)
                if r >= 0:
                    samples[i].append(elapsed)
        return samples

    def _done(self, key: tuple[object, ...], m: Measurement, began: float, *,
              cache: bool = True) -> Measurement:
        m = replace(m, replay_wall_s=time.perf_counter() - began)
        if cache:
            self._results[key] = m
        return m

    def close(self) -> None:
        if self.poisoned:
            return  # every call would fail; the process exits and the driver cleans up
        drv = cu.driver()
        drv.cuStreamSynchronize(self.stream)
        self.comparator.close()
        self.timer.close()
        if self.flush is not None:
            self.flush.close()
        for loaded in self._loaded.values():
            drv.cuModuleUnload(loaded.module)
        for ptr in self._buffers:
            drv.cuMemFree(ptr)
        self.arena.close()
        drv.cuStreamDestroy(self.stream)
        self.ctx.release()
