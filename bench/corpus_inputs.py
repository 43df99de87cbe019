"""Inputs and build stand-ins for the corpus programs of bench/corpus.py (issue #18).

Every generator is deterministic (a fixed numpy seed) and writes text in the format the
program's reader expects, with fixed-width fields formatted by numpy so that tens of MB take
about a second: `fscanf("%d")`, `sscanf("%f")`, `atof` and `operator>>` all accept leading
zeros.  The stand-in headers replace host-side APIs that CUDA 12+ removed; they are written
under bench/work/corpus/_shims/ and reach the build only through `-I`/`-include`, so the
upstream sources stay byte-for-byte as pinned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class InputFile:
    """A file a program reads, relative to the folder it runs in."""

    path: str
    write: Callable[[Path], None]
    # over ~1 MB: not written by `prepare` on the CPU machine (the carried tree stays small),
    # written on the GPU machine by `prepare --build-only`
    large: bool


# -- fixed-width text, vectorized -----------------------------------------------------------
def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """Non-negative integers as zero-padded ASCII, one row of ``width`` bytes each."""
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    v = values.astype(np.int64)
    if v.size and int(v.max()) >= 10**width:
        raise ValueError(f"{int(v.max())} does not fit in {width} digits")
    return ((v[:, None] // powers) % 10 + ord("0")).astype(np.uint8)


def _fixed(values: np.ndarray, int_digits: int, frac_digits: int) -> np.ndarray:
    """Reals as ``s`` + int digits + ``.`` + fraction digits, ``s`` being ``-`` or ``0``."""
    scaled = np.rint(np.abs(values) * 10**frac_digits).astype(np.int64)
    sign = np.where(values < 0, ord("-"), ord("0")).astype(np.uint8)[:, None]
    dot = np.full((len(values), 1), ord("."), dtype=np.uint8)
    whole = _digits(scaled // 10**frac_digits, int_digits)
    frac = _digits(scaled % 10**frac_digits, frac_digits)
    return np.hstack([sign, whole, dot, frac])


def _lines(columns: list[np.ndarray]) -> bytes:
    """Rows of byte columns joined by spaces, one line each."""
    n = len(columns[0])
    parts: list[np.ndarray] = []
    for i, col in enumerate(columns):
        if i:
            parts.append(np.full((n, 1), ord(" "), dtype=np.uint8))
        parts.append(col)
    parts.append(np.full((n, 1), ord("\n"), dtype=np.uint8))
    return np.hstack(parts).tobytes()


# -- the inputs -----------------------------------------------------------------------------
def bfs_graph(nodes: int, degree: int, seed: int = 18) -> Callable[[Path], None]:
    """Rodinia's graph format (graphgen): ``N``, ``N`` lines ``start count``, the source
    node, ``E``, ``E`` lines ``dest cost``.  Each node links to its successor (so the whole
    graph is reachable) and to ``degree - 1`` random nodes, like graph1MW_6.txt."""

    def write(path: Path) -> None:
        rng = np.random.default_rng(seed)
        ring = (np.arange(nodes, dtype=np.int64) + 1) % nodes
        random = rng.integers(0, nodes, size=(nodes, degree - 1), dtype=np.int64)
        dest = np.hstack([ring[:, None], random]).reshape(-1)
        cost = rng.integers(1, 11, size=dest.size, dtype=np.int64)
        starts = np.arange(nodes, dtype=np.int64) * degree
        counts = np.full(nodes, degree, dtype=np.int64)
        width = len(str(nodes * degree))
        with path.open("wb") as f:
            f.write(f"{nodes}\n".encode())
            f.write(_lines([_digits(starts, width), _digits(counts, 2)]))
            f.write(f"\n0\n\n{dest.size}\n".encode())
            f.write(_lines([_digits(dest, width), _digits(cost, 2)]))

    return write


def hotspot3d_grid(cells: int, kind: str, seed: int = 18) -> Callable[[Path], None]:
    """One value a line, as 3D.cu's readinput reads them: power in watts per cell (Rodinia's
    power_512x8 holds small values, up to ~1e-3) or temperature in kelvin (~320-340)."""

    def write(path: Path) -> None:
        rng = np.random.default_rng(seed + (0 if kind == "power" else 1))
        if kind == "power":
            col = _fixed(rng.uniform(0.0, 1e-3, cells), 1, 8)
        else:
            col = _fixed(rng.uniform(320.0, 340.0, cells), 3, 4)
        path.write_bytes(_lines([col]))

    return write


def kmeans_rows(points: int, features: int, clusters: int = 5,
                seed: int = 18) -> Callable[[Path], None]:
    """Rodinia kmeans text rows ``id f1 .. fn`` (the id is ignored), drawn around
    ``clusters`` centres in [0, 1) so the clustering converges as on kdd_cup."""

    def write(path: Path) -> None:
        rng = np.random.default_rng(seed)
        centres = rng.uniform(0.1, 0.9, size=(clusters, features))
        which = rng.integers(0, clusters, size=points)
        values = np.clip(centres[which] + rng.normal(0, 0.05, (points, features)), 0, 0.9999)
        cols = [_digits(np.arange(1, points + 1), len(str(points)))]
        cols += [_fixed(values[:, j], 1, 4) for j in range(features)]
        path.write_bytes(_lines(cols))

    return write


def cfd_mesh(width: int, height: int) -> Callable[[Path], None]:
    """euler3d's domain file: ``nel``, then per element its volume and four neighbours
    (1-based, Fortran numbering) each with a face normal.  A periodic ``width x height``
    quadrilateral grid whose four face normals sum to zero, so every cell is closed and a
    uniform free stream stays uniform (no NaNs however long the solver runs)."""

    def write(path: Path) -> None:
        n = width * height
        i = np.arange(n, dtype=np.int64)
        x, y = i % width, i // width
        neighbours = [
            (y * width + (x + 1) % width, (0.5, 0.0, 0.0)),
            (y * width + (x - 1) % width, (-0.5, 0.0, 0.0)),
            (((y + 1) % height) * width + x, (0.0, 0.5, 0.0)),
            (((y - 1) % height) * width + x, (0.0, -0.5, 0.0)),
        ]
        digits = len(str(n))
        cols = [_fixed(np.full(n, 1.0), 1, 3)]
        for nb, normal in neighbours:
            cols.append(_digits(nb + 1, digits))
            cols += [_fixed(np.full(n, c), 1, 3) for c in normal]
        with path.open("wb") as f:
            f.write(f"{n}\n".encode())
            f.write(_lines(cols))

    return write


# -- stand-ins for host APIs that CUDA 12+ removed -------------------------------------------
# Texture references (`texture<T, 1, mode> name;`, tex1Dfetch, cudaBindTexture) are gone from
# CUDA 12.  Forced into kmeans_cuda.cu with `-include`: each reference becomes a __device__
# struct holding the bound pointer, tex1Dfetch reads through it, cudaBindTexture copies the
# pointer into it.  Same values, read through L1 instead of the texture path.  The host code's
# writes of filterMode/normalized/channelDesc go to the host shadow of the __device__ struct
# (nvcc warns 20092-D, harmless).
KMEANS_TEXTURE_SHIM = """\
// written by bench/corpus_inputs.py: texture references for CUDA 12+ (removed there)
#pragma once
#include <cuda_runtime.h>
template <class T, int Dim, enum cudaTextureReadMode Mode>
struct r3_texture_reference {
  const T* ptr;
  // set by the host code as on a textureReference; written to the host shadow, unused
  enum cudaTextureFilterMode filterMode;
  int normalized;
  cudaChannelFormatDesc channelDesc;
  enum cudaTextureAddressMode addressMode[3];
};
#define texture __device__ r3_texture_reference
template <class T, int Dim, enum cudaTextureReadMode Mode>
__device__ __forceinline__ T tex1Dfetch(const r3_texture_reference<T, Dim, Mode>& t, int i)
{ return t.ptr[i]; }
template <class T, int Dim, enum cudaTextureReadMode Mode>
static inline cudaError_t cudaBindTexture(size_t* offset,
                                          const r3_texture_reference<T, Dim, Mode>* t,
                                          const void* dev, const cudaChannelFormatDesc*,
                                          size_t = 0)
{
  if (offset) *offset = 0;
  const T* p = static_cast<const T*>(dev);
  return cudaMemcpyToSymbol(*t, &p, sizeof(p));
}
template <class T, int Dim, enum cudaTextureReadMode Mode>
static inline cudaError_t cudaUnbindTexture(const r3_texture_reference<T, Dim, Mode>*)
{ return cudaSuccess; }
template <class T, int Dim, enum cudaTextureReadMode Mode>
static inline cudaError_t cudaUnbindTexture(const r3_texture_reference<T, Dim, Mode>&)
{ return cudaSuccess; }
"""

# euler3d.cu includes <helper_cuda.h> for checkCudaErrors and getLastCudaError only; the copy
# in Rodinia's hybridsort/ does not compile with CUDA 13 (see docs/corpus.md).  Its
# <helper_timer.h> is used as is (-I hybridsort).
CFD_HELPER_CUDA = """\
// written by bench/corpus_inputs.py: the two helper_cuda.h macros euler3d.cu uses
#pragma once
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
static inline void r3_check_cuda(cudaError_t e, const char* what, const char* file, int line)
{
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s(%d): CUDA error %d (%s) in %s\\n", file, line, (int)e,
                 cudaGetErrorString(e), what);
    std::exit(EXIT_FAILURE);
  }
}
#define checkCudaErrors(val) r3_check_cuda((val), #val, __FILE__, __LINE__)
#define getLastCudaError(msg) r3_check_cuda(cudaGetLastError(), (msg), __FILE__, __LINE__)
"""
