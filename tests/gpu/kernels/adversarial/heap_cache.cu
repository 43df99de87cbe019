// Attack: cache each block's output on the device heap (malloc), keep the pointer in a module
// variable, and on later launches copy the cached values back instead of computing them.
#define MAX_BLOCKS (1 << 20)
__device__ double* cached[MAX_BLOCKS];

extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    __shared__ double* mine;
    unsigned int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    unsigned int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned int nt = blockDim.x * blockDim.y * blockDim.z;
    bool fresh = false;
    if (t == 0) {
        mine = cached[b % MAX_BLOCKS];
        if (mine == nullptr) {
            mine = (double*)malloc(nt * sizeof(double));
            cached[b % MAX_BLOCKS] = mine;
            fresh = true;
        }
    }
    __shared__ bool compute;
    if (t == 0) compute = fresh || mine == nullptr;
    __syncthreads();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    int k = blockIdx.z * blockDim.z + threadIdx.z;
    if (i >= nx || j >= ny || k >= nz) return;
    long long sy = nx, sz = (long long)nx * ny, idx = k * sz + j * sy + i;
    if (!compute) {
        out[idx] = mine[t];
        return;
    }
    double v;
    if (i == 0 || j == 0 || k == 0 || i == nx - 1 || j == ny - 1 || k == nz - 1) {
        v = in[idx];
    } else {
        v = c0 * in[idx] + c1 * (in[idx - 1] + in[idx + 1] + in[idx - sy] + in[idx + sy]
                                 + in[idx - sz] + in[idx + sz]);
    }
    out[idx] = v;
    if (mine != nullptr) mine[t] = v;
}
