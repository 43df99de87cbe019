"""The recording bundle on disk: round trip, checksums, manifest validation, atomic writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from r3tui.cuda.arena import ARENA_BASE
from r3tui.domain import Dim3, Norm, TimeStats, Tolerance
from r3tui.errors import ChecksumMismatch, ManifestError, RecordingError
from r3tui.record.bundle import Bundle, BundleWriter, remove_stale_temporaries
from r3tui.record.manifest import (
    FORMAT_VERSION,
    AllocationInfo,
    ArenaInfo,
    BinaryImage,
    CheckLaunch,
    KernelInfo,
    LaunchInfo,
    Manifest,
    ParamInfo,
    ParamKind,
    SourceFile,
)

SOURCE = 'extern "C" __global__ void axpy(const double* x, double* y, int n) {}\n'


def _check_launch(w: BundleWriter, base: int, n: int) -> CheckLaunch:
    """A check launch of axpy on n elements of other data, placed from ``base`` on."""
    rng = np.random.default_rng(1)
    x = rng.random(n)
    y_before = np.zeros(n)
    return CheckLaunch(
        f"seed 1, n {n}",
        LaunchInfo(Dim3(1), Dim3(256), 0, Dim3(n), True),
        (
            ParamInfo(0, 0, 8, ParamKind.POINTER, base.to_bytes(8, "little"), "x",
                      allocation="x", alloc_offset=0),
            ParamInfo(1, 8, 8, ParamKind.POINTER, (base + x.nbytes).to_bytes(8, "little"), "y",
                      allocation="y", alloc_offset=0),
            ParamInfo(2, 16, 4, ParamKind.SCALAR, n.to_bytes(4, "little"), "n", dtype="int32",
                      value=n),
        ),
        (
            AllocationInfo("x", base, x.nbytes, w.add_blob(x.tobytes()), w.add_blob(x.tobytes()),
                           dtype="float64"),
            AllocationInfo("y", base + x.nbytes, x.nbytes, w.add_blob(y_before.tobytes()),
                           w.add_blob((y_before + 2 * x).tobytes()), dtype="float64"),
        ),
    )


def write_bundle(path: Path, *, compress: str | None = "zlib", n: int = 4096,
                 check: bool = False) -> Bundle:
    rng = np.random.default_rng(0)
    x = rng.random(n)
    y_before = np.zeros(n)  # compressible
    y_after = y_before + 2 * x
    with BundleWriter(path, compress=compress) as w:
        src = w.add_blob(SOURCE.encode())
        binary = w.add_blob(b"\x7fELF fake cubin")
        xs = w.add_blob(x.tobytes())
        allocations = (
            AllocationInfo("x", ARENA_BASE, x.nbytes, xs, w.add_blob(x.tobytes()),
                           dtype="float64", shape=(n,)),
            AllocationInfo("y", ARENA_BASE + x.nbytes, x.nbytes, w.add_blob(y_before.tobytes()),
                           w.add_blob(y_after.tobytes()),
                           tolerance=Tolerance(rtol=1e-12, norm=Norm.LINF), dtype="float64"),
        )
        params = (
            ParamInfo(0, 0, 8, ParamKind.POINTER, ARENA_BASE.to_bytes(8, "little"), "x",
                      allocation="x", alloc_offset=0),
            ParamInfo(1, 8, 8, ParamKind.POINTER, (ARENA_BASE + x.nbytes).to_bytes(8, "little"),
                      "y", allocation="y", alloc_offset=0),
            ParamInfo(2, 16, 4, ParamKind.SCALAR, n.to_bytes(4, "little"), "n", dtype="int32",
                      value=n),
        )
        checks = (_check_launch(w, ARENA_BASE + 2 * x.nbytes, n // 4),) if check else ()
        manifest = Manifest(
            kernel=KernelInfo("axpy", "axpy", (SourceFile("kernel.cu", src),), "nvrtc",
                              "nvrtc 13.0", ("-O3",), (("TILE", "8"),),
                              BinaryImage(binary, "cubin", "sm_90")),
            launch=LaunchInfo(Dim3(16), Dim3(256), 0, Dim3(n), True, 1, 1e-5,
                              TimeStats(1e-5, 9e-6, 1e-7, 20)),
            params=params,
            allocations=allocations,
            arena=ArenaInfo(ARENA_BASE, 2 << 20),
            recorded_at="2026-12-02T10:00:00+00:00",
            blobs=dict(w.blobs),
            provenance={"gpu": "NVIDIA H200"},
            checks=checks,
        )
        return w.commit(manifest)


def manifest_json(tmp_path: Path, check: bool = False) -> tuple[Path, dict[str, Any]]:
    bundle = write_bundle(tmp_path / "b", check=check)
    return bundle.path, json.loads((bundle.path / "manifest.json").read_text())


def test_round_trip_keeps_every_field_and_the_identity(tmp_path: Path) -> None:
    written = write_bundle(tmp_path / "b")
    loaded = Bundle.open(tmp_path / "b", verify=True)
    assert loaded.manifest == written.manifest
    assert loaded.sha256 == written.sha256 == written.manifest.sha256
    m = loaded.manifest
    assert m.format_version == FORMAT_VERSION
    assert m.launch.baseline == TimeStats(1e-5, 9e-6, 1e-7, 20)
    assert m.allocation("y").tolerance == Tolerance(rtol=1e-12, norm=Norm.LINF)
    assert loaded.source() == SOURCE
    assert m.arg_bytes()[:8] == ARENA_BASE.to_bytes(8, "little") and len(m.arg_bytes()) == 20
    assert m.to_launch().key == ("axpy", (16, 1, 1), (256, 1, 1), 0)


def test_identical_contents_are_stored_once_and_compression_keeps_the_sha(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    x = bundle.manifest.allocation("x")
    assert x.prologue == x.epilogue  # read-only buffer: one blob
    files = sorted(p.name for p in (bundle.path / "blobs").iterdir())
    assert len(files) == len(bundle.manifest.blobs) == 5
    y = bundle.manifest.allocation("y")
    assert (bundle.path / "blobs" / f"{y.prologue}.zlib").is_file()  # zeros compress
    assert (bundle.path / "blobs" / x.prologue).is_file()  # random doubles are stored raw
    assert bundle.blob(y.prologue) == bytes(y.size)


def test_identity_does_not_depend_on_compression(tmp_path: Path) -> None:
    a = write_bundle(tmp_path / "a", compress="zlib")
    b = write_bundle(tmp_path / "b", compress=None)
    assert a.sha256 == b.sha256


def test_a_flipped_byte_in_a_blob_is_named(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    x = bundle.manifest.allocation("x")
    blob = bundle.path / "blobs" / x.prologue
    data = bytearray(blob.read_bytes())
    data[100] ^= 0x01
    blob.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatch, match=rf"blob {x.prologue[:12]} \(prologue of x\)"):
        Bundle.open(bundle.path, verify=True)
    opened = Bundle.open(bundle.path)  # structure still fine without hashing
    with pytest.raises(ChecksumMismatch):
        opened.blob(x.prologue)


def test_a_corrupt_compressed_blob_is_named(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    y = bundle.manifest.allocation("y")
    blob = bundle.path / "blobs" / f"{y.prologue}.zlib"
    blob.write_bytes(blob.read_bytes()[:-5] + b"xxxxx")
    with pytest.raises(ChecksumMismatch, match="prologue of y"):
        Bundle.open(bundle.path, verify=True)


def test_a_missing_blob_is_named(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b")
    (bundle.path / "blobs" / bundle.manifest.kernel.sources[0].sha256).unlink()
    with pytest.raises(RecordingError, match=r"source kernel.cu\) is missing"):
        Bundle.open(bundle.path)


def _mutated(tmp_path: Path, mutate: Any, check: bool = False) -> str:
    path, data = manifest_json(tmp_path, check)
    mutate(data)
    (path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError) as info:
        Bundle.open(path)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    "mutate,expect",
    [
        (lambda d: d.pop("kernel"), "'kernel' is missing"),
        (lambda d: d["kernel"].pop("entry_point"), "'kernel.entry_point' is missing"),
        (lambda d: d["allocations"][1].pop("epilogue"), "'allocations[1].epilogue' is missing"),
        (lambda d: d.update(format_version=99), "unsupported version 99"),
        (lambda d: d.update(format_version="1"), "'format_version': expected int, got str"),
        (lambda d: d["launch"].update(grid="16"), "'launch.grid': expected list"),
        (lambda d: d["launch"].update(count=True), "'launch.count': expected int, got bool"),
        (lambda d: d["params"][2].update(dtype="complex"), "unknown dtype 'complex'"),
        (lambda d: d["params"][0].update(allocation="z"), "no allocation named 'z'"),
        (lambda d: d["params"][1].update(raw="00"), "'params[1].raw': 1 bytes"),
        (lambda d: d["params"][1].update(offset=4), "'params[1].offset': overlaps"),
        (lambda d: d["allocations"][0].update(address=1), "allocation outside the arena"),
        (lambda d: d["allocations"][0]["verify"].update(policy="fuzzy"), "expected 'exact' or"),
        (lambda d: d["allocations"][1]["verify"].update(norm="l3"), "norm"),
        (lambda d: d["allocations"][0].update(prologue="ab" * 32), "is not in 'blobs'"),
        (lambda d: d["kernel"]["sources"][0].update(sha256="nothex"), "not a sha256"),
        (lambda d: d["blobs"].update({next(iter(d["blobs"])): -1}), "must be >= 0"),
    ],
)
def test_manifest_validation_names_the_field(tmp_path: Path, mutate: Any, expect: str) -> None:
    assert expect in _mutated(tmp_path, mutate)


def test_check_launches_round_trip_and_older_bundles_keep_their_identity(
        tmp_path: Path) -> None:
    plain = write_bundle(tmp_path / "plain")
    assert "checks" not in json.loads((plain.path / "manifest.json").read_text())
    bundle = write_bundle(tmp_path / "checked", check=True)
    again = Bundle.open(bundle.path, verify=True)
    assert again.manifest == bundle.manifest
    (check,) = again.manifest.checks
    assert check.label == "seed 1, n 1024" and check.launch.work == Dim3(1024)
    assert [a.name for a in again.manifest.all_allocations] == ["x", "y", "x", "y"]
    assert check.arg_bytes()[16:20] == (1024).to_bytes(4, "little")
    assert again.sha256 != plain.sha256


def test_the_applications_cache_split_round_trips_and_older_bundles_have_none(
        tmp_path: Path) -> None:
    path, data = manifest_json(tmp_path)
    assert "cache_config" not in data["launch"] and "carveout" not in data["launch"]
    assert Bundle.open(path).manifest.launch.cache_config is None
    data["launch"].update(cache_config=2, carveout=25)  # prefer L1; a quarter to shared memory
    (path / "manifest.json").write_text(json.dumps(data))
    launch = Bundle.open(path).manifest.launch
    assert (launch.cache_config, launch.carveout) == (2, 25)
    for key, value, expect in (("cache_config", 4, "must be 0 to 3"),
                               ("carveout", 101, "must be -1 to 100"),
                               ("carveout", "max", "expected int")):
        bad = {**data, "launch": {**data["launch"], key: value}}
        (path / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(ManifestError, match=expect):
            Bundle.open(path)


@pytest.mark.parametrize(
    "mutate,expect",
    [
        (lambda d: d["checks"][0]["params"][0].update(allocation="z"),
         "'checks[0].params[0].allocation': no allocation named 'z'"),
        (lambda d: d["checks"][0]["allocations"][1].update(epilogue="cd" * 32),
         "'checks[0].allocations[1].epilogue': blob cdcdcdcdcdcd is not in 'blobs'"),
        (lambda d: d["checks"][0].pop("label"), "'checks[0].label' is missing"),
        (lambda d: d["checks"][0]["launch"].update(block=[0]), "checks[0].launch.block"),
    ],
)
def test_check_launch_validation_names_the_field(tmp_path: Path, mutate: Any, expect: str
                                                 ) -> None:
    assert expect in _mutated(tmp_path, mutate, check=True)


def test_not_json_and_not_a_bundle(tmp_path: Path) -> None:
    path, _ = manifest_json(tmp_path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Bundle.open(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(RecordingError, match="not a recording bundle"):
        Bundle.open(tmp_path / "empty")
    with pytest.raises(RecordingError, match="no recording bundle"):
        Bundle.open(tmp_path / "nowhere")


def test_a_failed_writer_leaves_nothing_that_opens(tmp_path: Path) -> None:
    target = tmp_path / "b"
    with pytest.raises(RuntimeError), BundleWriter(target) as w:
        w.add_blob(b"prologue")
        raise RuntimeError("recorder crashed")
    assert not target.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_killed_writer_leaves_only_a_hidden_temporary(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import os
        from r3tui.record.bundle import BundleWriter
        w = BundleWriter({str(tmp_path / "b")!r})
        w.add_blob(os.urandom(1 << 16))
        os._exit(9)  # killed before commit: no cleanup runs
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", script], env=env)
    assert proc.returncode == 9
    assert not (tmp_path / "b").exists()
    leftovers = list(tmp_path.iterdir())
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".b.tmp-")
    assert not (leftovers[0] / "manifest.json").exists()
    with pytest.raises(RecordingError):
        Bundle.open(leftovers[0])
    assert remove_stale_temporaries(tmp_path) == 1 and list(tmp_path.iterdir()) == []


def test_writer_refuses_to_overwrite_unless_told(tmp_path: Path) -> None:
    write_bundle(tmp_path / "b")
    with pytest.raises(RecordingError, match="already exists"):
        BundleWriter(tmp_path / "b")
    first = Bundle.open(tmp_path / "b").sha256
    w = BundleWriter(tmp_path / "b", overwrite=True)
    w.abort()
    assert Bundle.open(tmp_path / "b").sha256 == first


def test_commit_rejects_a_manifest_naming_unwritten_blobs(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "a")
    with BundleWriter(tmp_path / "b") as w, pytest.raises(ValueError, match="never added"):
        w.commit(bundle.manifest)
    assert not (tmp_path / "b").exists()
