"""How an application set up a kernel's launches travels from the interposer's dump into
the bundle, where every replay does the same: the L1/shared-memory split
(cudaFuncSetCacheConfig, the preferred carveout; hotspot3D asks for a larger L1, and
replayed without it its tuned kernel gained 1.186x where the application measured 1.071x)
and a cooperative launch (cudaLaunchCooperativeKernel). The interposer's side runs in
tests/gpu/test_gpu_app_record.py and test_gpu_app_coop.py."""

from __future__ import annotations

from pathlib import Path

from r3tui.record.bundle import Bundle
from tests.unit.test_app_recorder import _build, _synthetic


def test_the_split_the_application_set_is_in_the_bundle(tmp_path: Path) -> None:
    d = _synthetic(tmp_path / "raw")
    configs = [e for e in d.lines if e.get("ev") == "config"]
    # cudaFuncCachePreferL1, no carveout set; launched with cudaLaunchCooperativeKernel
    configs[0].update(cache=2, carveout=-1, coop=1)
    d.write()
    data = _build(tmp_path)
    kernels = {k["entry_point"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    (config,) = kernels["_Z9ptr_kernelP4Pairi"]["configs"]
    bundle = Bundle.open(tmp_path / "out" / config["bundle"], verify=True)
    launch = bundle.manifest.launch
    assert (launch.cache_config, launch.carveout, launch.cooperative) == (2, None, True)
    assert '"cooperative":true' in (bundle.path / "manifest.json").read_text().replace(" ", "")


def test_a_dump_without_the_split_gives_the_drivers_default(tmp_path: Path) -> None:
    _synthetic(tmp_path / "raw").write()  # an interposer before the split was reported
    data = _build(tmp_path)
    kernels = {k["entry_point"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    (config,) = kernels["_Z9ptr_kernelP4Pairi"]["configs"]
    launch = Bundle.open(tmp_path / "out" / config["bundle"], verify=True).manifest.launch
    assert (launch.cache_config, launch.carveout, launch.cooperative) == (None, None, False)
