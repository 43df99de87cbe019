// Sum of a large float array, accumulated into one double: *out += sum(x[0:n]).
//
// Naive block reduction: each thread loads one element into shared memory, then a tree
// reduction with "interleaved addressing" (tid % (2*stride) == 0): divergent warps, bank
// conflicts and one __syncthreads per level, all the way down to a single thread.  Every block
// then issues one atomicAdd on the same address.  Headroom: grid-stride loops with several
// elements per thread (vectorised float4 loads), sequential addressing, warp shuffles
// (__shfl_down_sync) for the last levels, one atomic per warp-reduced block or a two-pass
// reduction, fewer blocks so fewer contended atomics.
//
// Correct for any block shape of at most MAX_THREADS threads: the block is flattened, each
// block owns blockVolume consecutive elements, and out-of-range threads contribute 0, so a grid
// re-derived from the work size (which may over-cover n) keeps the sum exact up to rounding.
#ifndef MAX_THREADS
#define MAX_THREADS 1024
#endif

extern "C" __global__ void reduce_sum(const float* x, double* out, int n)
{
    __shared__ float partial[MAX_THREADS];
    unsigned int nthreads = blockDim.x * blockDim.y * blockDim.z;
    unsigned int tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned long long block = blockIdx.x + (unsigned long long)gridDim.x
                             * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
    unsigned long long i = block * nthreads + tid;
    partial[tid] = (i < (unsigned long long)n) ? x[i] : 0.0f;
    __syncthreads();
    for (unsigned int stride = 1; stride < nthreads; stride *= 2) {
        if (tid % (2 * stride) == 0 && tid + stride < nthreads) {
            partial[tid] += partial[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        atomicAdd(out, (double)partial[0]);
    }
}
