// Row-wise softmax  y[r, c] = exp(x[r, c] - max_c x[r, :]) / sum_c exp(x[r, c] - max_c x[r, :]),
// float32, row-major rows x cols (the attention / logits softmax of ML training).
//
// Naive: one block per row and three passes over the row in global memory (max, sum of
// exponentials, normalise), exp recomputed in the last pass, a division per element, scalar
// loads, and both block reductions done as a shared-memory tree with a __syncthreads per level
// and divergent "tid % (2*stride)" indexing.  Headroom: keep the row in registers or shared
// memory (one global read), online softmax (max and sum in one pass), warp-shuffle reductions,
// float4 loads/stores, multiply by the reciprocal, several rows per block for short rows.
//
// The grid is one block per row (rows beyond the grid are not processed).  Correct for any
// block shape of at most MAX_THREADS threads: the block is flattened into one thread index.
#ifndef MAX_THREADS
#define MAX_THREADS 1024
#endif

extern "C" __global__ void softmax(const float* x, float* y, int rows, int cols)
{
    __shared__ float red[MAX_THREADS];
    int nthreads = blockDim.x * blockDim.y * blockDim.z;
    int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int row = blockIdx.x;
    if (row >= rows) {
        return;  // uniform across the block, so no thread is left waiting at a barrier
    }
    const float* xr = x + (long long)row * cols;
    float* yr = y + (long long)row * cols;

    float m = -3.402823466e38f;
    for (int c = tid; c < cols; c += nthreads) {
        m = fmaxf(m, xr[c]);
    }
    red[tid] = m;
    __syncthreads();
    for (int stride = 1; stride < nthreads; stride *= 2) {
        if (tid % (2 * stride) == 0 && tid + stride < nthreads) {
            red[tid] = fmaxf(red[tid], red[tid + stride]);
        }
        __syncthreads();
    }
    float row_max = red[0];
    __syncthreads();  // everyone has read red[0] before it is overwritten

    float s = 0.0f;
    for (int c = tid; c < cols; c += nthreads) {
        s += expf(xr[c] - row_max);
    }
    red[tid] = s;
    __syncthreads();
    for (int stride = 1; stride < nthreads; stride *= 2) {
        if (tid % (2 * stride) == 0 && tid + stride < nthreads) {
            red[tid] += red[tid + stride];
        }
        __syncthreads();
    }
    float row_sum = red[0];

    for (int c = tid; c < cols; c += nthreads) {
        yr[c] = expf(xr[c] - row_max) / row_sum;
    }
}
