// Sparse matrix-vector product y = A*x with A in CSR form, double precision.
//
// Naive "scalar CSR": one thread per row walks its row's nonzeros in order.  Neighbouring
// threads read vals/cols from different rows, so loads of the matrix are uncoalesced; rows of
// very different lengths leave most lanes of a warp idle while one long row finishes; x is
// gathered through the ordinary load path (no __ldg / __restrict__); rowptr is read twice per
// thread.  Headroom: warp- or subwarp-per-row ("vector CSR") with a shuffle reduction, read-only
// loads of x, unrolling, load balancing by nonzeros (merge-path / row binning).
// Correct for any block shape: the row index is bounds-checked.
extern "C" __global__ void spmv_csr(int nrows, const int* rowptr, const int* cols,
                                    const double* vals, const double* x, double* y)
{
    int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= nrows) {
        return;
    }
    double sum = 0.0;
    for (int k = rowptr[row]; k < rowptr[row + 1]; ++k) {
        sum += vals[k] * x[cols[k]];
    }
    y[row] = sum;
}
