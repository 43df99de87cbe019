"""Argument packing and the kernel-signature check, without a GPU."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from r3tui.domain import Dim3, Tolerance
from r3tui.errors import RecordingError
from r3tui.record.layout import (
    check_signature,
    device_global_names,
    layout_from_buffer,
    pack_params,
    params_from_bytes,
    plan_allocations,
)
from r3tui.record.manifest import ParamKind, assemble_arg_bytes
from r3tui.record.spec import Buffer, KernelInputs, PointerTable, Scalar

BASE = 0x153940000000


def inputs() -> KernelInputs:
    return KernelInputs(
        args=[
            PointerTable("table", ["y", "x"]),
            Buffer("x", np.arange(10, dtype=np.float32)),
            Buffer("y", np.zeros(4, dtype=np.float64), tolerance=Tolerance(rtol=1e-9),
                   pad_bytes=16),
            Scalar("n", 10, "int32"),
            Scalar("a", 0.5, "float64"),
        ],
        block=Dim3(32),
        work=Dim3(10),
    )


# What cuFuncGetParamInfo reports for (void*, float*, double*, int, double): natural alignment.
LAYOUT = [(0, 8), (8, 8), (16, 8), (24, 4), (32, 8)]


def test_plan_sizes_dtypes_and_pointer_table_contents() -> None:
    plans = plan_allocations(inputs())
    assert [(p.name, p.size, p.dtype) for p in plans] == [
        ("table", 16, "uint64"), ("x", 40, "float32"), ("y", 48, "float64")]
    addresses = {"table": BASE, "x": BASE + 256, "y": BASE + 512}
    assert plans[0].contents(addresses) == struct.pack("<2Q", BASE + 512, BASE + 256)
    assert plans[2].contents(addresses) == bytes(48)
    assert plans[2].tolerance == Tolerance(rtol=1e-9)


def test_pack_params_puts_each_value_at_its_offset() -> None:
    spec = inputs()
    check_signature(spec, LAYOUT, "k")
    addresses = {"table": BASE, "x": BASE + 256, "y": BASE + 512}
    params = pack_params(spec, LAYOUT, addresses)
    assert [p.kind for p in params] == [ParamKind.POINTER] * 3 + [ParamKind.SCALAR] * 2
    assert params[2].allocation == "y" and params[3].value == 10 and params[4].dtype == "float64"
    buf = assemble_arg_bytes(params)
    assert len(buf) == 40
    assert struct.unpack_from("<QQQi", buf) == (BASE, BASE + 256, BASE + 512, 10)
    assert buf[28:32] == bytes(4)  # alignment padding stays zero
    assert struct.unpack_from("<d", buf, 32) == (0.5,)


def test_signature_mismatch_is_a_clear_error() -> None:
    with pytest.raises(RecordingError, match="takes 4 parameters but the inputs file gives 5"):
        check_signature(inputs(), LAYOUT[:4], "k")
    wrong = [*LAYOUT[:3], (24, 8), (32, 8)]
    with pytest.raises(RecordingError, match="parameter 3 is 8 bytes but argument 'n' is a 4-byte"):
        check_signature(inputs(), wrong, "k")


def test_a_scalar_that_does_not_fit_its_dtype_is_refused() -> None:
    spec = KernelInputs(args=[Scalar("n", 1 << 40, "int32")], block=Dim3(1), grid=Dim3(1))
    with pytest.raises((RecordingError, OverflowError)):
        pack_params(spec, [(0, 4)], {})


def test_tolerance_needs_a_known_dtype() -> None:
    spec = KernelInputs(args=[Buffer("c", np.zeros(2, dtype=np.complex64),
                                     tolerance=Tolerance(rtol=1e-3))], block=Dim3(1), grid=Dim3(1))
    with pytest.raises(RecordingError, match="declares a tolerance"):
        plan_allocations(spec)


def test_captured_bytes_are_split_into_pointers_and_values() -> None:
    buf = struct.pack("<QQif", BASE + 8, 12345, 7, 1.5)
    layout = [(0, 8), (8, 8), (16, 4), (20, 4)]
    params = params_from_bytes(buf, layout, lambda a: ("alloc0", a - BASE) if a >= BASE else None)
    assert [p.kind for p in params] == [ParamKind.POINTER, ParamKind.BYTES, ParamKind.BYTES,
                                        ParamKind.BYTES]
    assert params[0].allocation == "alloc0" and params[0].alloc_offset == 8
    assert assemble_arg_bytes(params) == buf
    assert layout_from_buffer(buf) == [(0, 8), (8, 8), (16, 8)]
    with pytest.raises(RecordingError, match="parameter 1 needs"):
        params_from_bytes(buf[:10], layout, lambda a: None)


def test_device_global_names() -> None:
    source = """
    __device__ int calls;                 // a counter
    __constant__ float weights[16] = {1};
    static __device__ double acc[2][3];
    /* __device__ int commented_out; */
    __device__ __forceinline__ float helper(float x) { return x; }
    __global__ void k(int* p) { int local; }
    """
    assert device_global_names(source) == ["calls", "weights", "acc"]
