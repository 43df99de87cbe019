"""bench/rule_gains.py's arguments and the bundle change it makes, on the CPU (the
measurement itself replays on a GPU: bench/gpu_session.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from r3tui.record.bundle import Bundle
from tests.unit.test_bundle import write_bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from rule_gains import main, parse_blocks, parse_values, set_carveout, variants


def test_block_shapes_are_read_with_missing_axes_as_one() -> None:
    assert parse_blocks("32x8,16x16x1,128") == [(32, 8, 1), (16, 16, 1), (128, 1, 1)]
    assert parse_blocks("") == []
    for bad in ("3y", "0x8", "1x2x3x4", "x8"):
        with pytest.raises(ValueError, match="not a block shape"):
            parse_blocks(bad)


def test_named_values_narrow_the_points_measured() -> None:
    assert parse_values("R3_TILE=32,64; R3_CF_X=4") == {"R3_TILE": (32, 64), "R3_CF_X": (4,)}
    for bad in ("R3_TILE", "R3_TILE=a", "=4"):
        with pytest.raises(ValueError, match="not NAME=V1,V2"):
            parse_values(bad)
    sgemm = (Path(__file__).resolve().parents[2] / "examples/sgemm/kernel.cu").read_text()
    every = variants(sgemm, "sgemm", ("coarsen", "tile_shared"))
    only = {"R3_TILE": (64,), "R3_CF_X": (4,), "R3_CF_Y": (4,), "R3_STAGES": (2,),
            "R3_EDGE_TILES": (1,)}
    few = variants(sgemm, "sgemm", ("coarsen", "tile_shared"), only)
    assert 0 < len(few) < len(every)
    for _label, _text, defines in few:
        assert all(int(v) in only[name] for name, v in defines if name in only)
    # the point both new layouts meet at: two tiles in flight, neighbouring outputs along x,
    # the edge blocks' tiles unrolled too
    assert any(dict(d) == {"R3_CF_X": "4", "R3_CF_Y": "4", "R3_X_CONTIGUOUS": "1",
                           "R3_TILE": "64", "R3_STAGES": "2", "R3_EDGE_TILES": "1"}
               for _l, _t, d in few)


@pytest.mark.parametrize("argv", [["--blocks", "16xx8"], ["--carveout", "101"],
                                  ["--carveout", "-1"], ["--values", "R3_TILE"]])
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rule_gains.py: error: ")


def test_the_carveout_reaches_every_replay_through_the_manifest(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "b.r3b")
    assert Bundle.open(bundle.path).manifest.launch.carveout is None
    set_carveout(bundle.path, 100)
    opened = Bundle.open(bundle.path, verify=True)
    assert opened.manifest.launch.carveout == 100
    assert opened.manifest.launch.block == bundle.manifest.launch.block
