// Single-precision GEMM  C = alpha*A*B + beta*C, row-major, A is MxK, B is KxN, C is MxN.
//
// Naive on purpose: one thread per element of C computes a K-long dot product straight from
// global memory.  Threads of a warp share a row of A (broadcast) and read consecutive columns of
// B, so loads coalesce, but every element of A and B is fetched from L1/L2 M or N times over and
// each FMA needs two loads: the kernel is bound by load bandwidth, not by the FMA units.
// Headroom: shared-memory tiling, register blocking (each thread computes a small tile of C),
// float4 loads, double-buffered tiles / cp.async, __restrict__, unrolling the k loop.
// Correct for any block shape: (row, col, layer) are bounds-checked.
extern "C" __global__ void sgemm(int M, int N, int K, float alpha, const float* A, const float* B,
                                 float beta, float* C)
{
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int layer = blockIdx.z * blockDim.z + threadIdx.z;
    // C is updated in place, so threads outside the 2-D work (layer > 0 under a 3-D block) must
    // not touch it: a second update would apply beta twice.
    if (row >= M || col >= N || layer != 0) {
        return;
    }
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) {
        sum += A[(long long)row * K + k] * B[(long long)k * N + col];
    }
    long long idx = (long long)row * N + col;
    C[idx] = alpha * sum + beta * C[idx];
}
