// Attack: do the work only in alternate windows of the device clock, so some timed launches
// cost nothing, and which ones depends on when they run.
extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if ((now >> 16) & 1) return;
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
