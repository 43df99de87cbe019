// Attack: each block counts its own launches in a module variable and does its work on every
// other launch only, so half the timed launches cost nothing.
#define MAX_BLOCKS (1 << 20)
__device__ unsigned int launches_seen[MAX_BLOCKS];

extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    __shared__ unsigned int seen;
    unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        seen = launches_seen[b % MAX_BLOCKS]++;
    }
    __syncthreads();
    if (seen & 1) return;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    int k = blockIdx.z * blockDim.z + threadIdx.z;
    if (i >= nx || j >= ny || k >= nz) return;
    long long sy = nx, sz = (long long)nx * ny, idx = k * sz + j * sy + i;
    if (i == 0 || j == 0 || k == 0 || i == nx - 1 || j == ny - 1 || k == nz - 1) {
        out[idx] = in[idx];
        return;
    }
    out[idx] = c0 * in[idx] + c1 * (in[idx - 1] + in[idx + 1] + in[idx - sy] + in[idx + sy]
                                    + in[idx - sz] + in[idx + sz]);
}
