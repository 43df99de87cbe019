// Batched AXPY through a table of pointer pairs: for each pair p, p.y[i] = a*p.x[i] + p.y[i].
//
// The kernel finds its arrays only by following the device addresses stored in ``pairs``, which
// is what a replay at fixed addresses must keep valid.  The same arrays are also passed as
// trailing parameters (x0, y0, x1, ...) only because a recorded launch allocates buffers that are
// kernel parameters; the kernel body never touches those parameters.
//
// With a = 0.5 (a power of two) a*x is exact, so fused and unfused multiply-add give the same
// bits and the result is verified byte for byte.  One thread per (i, pair): x indexes elements,
// y indexes pairs; all three indices are bounds-checked, so any block shape is correct.
struct Pair {
    const double* x;
    double* y;
};

extern "C" __global__ void ptr_struct(const Pair* pairs, int npairs, int n, double a,
                                      const double* x0, double* y0, const double* x1, double* y1,
                                      const double* x2, double* y2)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int p = blockIdx.y * blockDim.y + threadIdx.y;
    int layer = blockIdx.z * blockDim.z + threadIdx.z;
    // y is updated in place: threads outside the 2-D work (layer > 0) must not update it again.
    if (i >= n || p >= npairs || layer != 0) {
        return;
    }
    Pair pair = pairs[p];
    pair.y[i] = a * pair.x[i] + pair.y[i];
}
