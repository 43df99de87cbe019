"""The compile pool: real NVRTC compiles in worker processes, a real crash, a real timeout."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from r3tui.compile import CompileCache, CompilePool, CompileRequest, cache_key, get_toolchain
from r3tui.errors import ConfigError

DATA = Path(__file__).parent / "data"
KERNELS = (DATA / "kernels.cu").read_text()
# About a minute of NVRTC time (see the file); these tests kill it long before.
SLOW = CompileRequest((DATA / "slow.cu").read_text(), "slow")


def wait_for(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_pool_compiles_in_parallel_and_keeps_order() -> None:
    names = ["saxpy", "tile", "local_array", "pressure", "bounded", "axpy<float>"]
    requests = [CompileRequest(KERNELS, name) for name in names]
    requests += [
        CompileRequest(KERNELS, "saxpy", options=(f"-maxrregcount={n}",)) for n in (24, 40)
    ]
    with CompilePool(workers=2) as pool:
        results = pool.map("nvrtc", requests)
        # Both workers run at once: two slow compiles are seen in flight together.
        slow = [
            pool.submit("nvrtc", CompileRequest(SLOW.source, "slow", defines=(("N", str(i)),)))
            for i in range(2)
        ]
        wait_for(lambda: len(pool.running()) == 2)
        pool.close(cancel_pending=True)
    assert all(f.cancelled() for f in slow)
    assert [r.ok for r in results] == [True] * len(requests)
    lowered = [r.lowered_name for r in results]
    assert lowered[:5] == names[:5] and lowered[5] == "_Z4axpyIfEvT_PKS0_PS0_i"
    assert results[1].resources.shared_mem_bytes == 1224
    assert [r.cache_key for r in results] == [
        cache_key(get_toolchain("nvrtc"), r) for r in requests
    ]


def test_a_crashed_compiler_process_is_a_failed_result() -> None:
    with CompilePool(workers=1) as pool:
        doomed = pool.submit("nvrtc", SLOW)
        wait_for(lambda: bool(pool.running()))
        (pid,) = pool.running()
        os.kill(pid, signal.SIGKILL)  # what the OOM killer or a segfault in NVRTC does
        result = doomed.result(timeout=60)
        # A fresh worker takes over.
        after = pool.submit("nvrtc", CompileRequest(KERNELS, "saxpy")).result(timeout=60)
    assert not result.ok and result.binary is None
    assert result.log.startswith("compiler process crashed: killed by SIGKILL")
    assert "'slow'" in result.log
    assert result.cache_key == cache_key(get_toolchain("nvrtc"), SLOW)
    assert after.ok


def test_a_compile_past_the_timeout_is_killed() -> None:
    started = time.monotonic()
    with CompilePool(workers=1, timeout_s=1.0) as pool:
        result = pool.submit("nvrtc", SLOW).result(timeout=60)
    assert not result.ok
    assert "compile timed out after 1 s" in result.log
    assert time.monotonic() - started < 30


def test_cache_is_consulted_in_the_parent_and_filled_on_completion(tmp_path: Path) -> None:
    nvrtc = get_toolchain("nvrtc")
    cache = CompileCache(tmp_path)
    warm = CompileRequest(KERNELS, "tile")
    cache.compile(nvrtc, warm)
    cold = CompileRequest(KERNELS, "bounded")
    with CompilePool(workers=1, cache=cache) as pool:
        hit = pool.submit("nvrtc", warm)
        assert hit.done() and pool.running() == {}  # answered without any worker
        assert hit.result().cached
        first, duplicate = pool.submit("nvrtc", cold), pool.submit("nvrtc", cold)
        a, b = first.result(timeout=60), duplicate.result(timeout=60)
    assert a.ok and not a.cached and b.ok and b.cached  # the duplicate joined the running compile
    assert a.binary_sha256 == b.binary_sha256
    assert CompileCache(tmp_path).get(a.cache_key) is not None


def test_bad_requests_fail_at_submit() -> None:
    with CompilePool(workers=1) as pool:
        with pytest.raises(ConfigError):
            pool.submit("nvrtc", CompileRequest(KERNELS, "saxpy", options=("--bogus",)))
        with pytest.raises(ConfigError):
            pool.submit("clang", CompileRequest(KERNELS, "saxpy"))
        with pytest.raises(ConfigError, match="cannot build sm_35"):
            pool.submit("nvrtc", CompileRequest(KERNELS, "saxpy", arch="sm_35"))
        # A source error is a value, as it is in-process.
        broken = pool.submit("nvrtc", CompileRequest("__global__ void k( {}", "k")).result(60)
        assert not broken.ok and "error" in broken.log
    with pytest.raises(RuntimeError):
        pool.submit("nvrtc", CompileRequest(KERNELS, "saxpy"))
