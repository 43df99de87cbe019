// Attack: skip_after_first with its flags hidden in a function-scope static array of a device
// function: static storage that survives between launches, with no module-scope declaration.
__device__ unsigned char* done_flags()
{
    static unsigned char done[1 << 24];
    return done;
}

extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    int k = blockIdx.z * blockDim.z + threadIdx.z;
    if (i >= nx || j >= ny || k >= nz) return;
    long long sy = nx, sz = (long long)nx * ny, idx = k * sz + j * sy + i;
    unsigned char* done = done_flags();
    if (done[idx]) return;
    if (i == 0 || j == 0 || k == 0 || i == nx - 1 || j == ny - 1 || k == nz - 1) {
        out[idx] = in[idx];
    } else {
        out[idx] = c0 * in[idx] + c1 * (in[idx - 1] + in[idx + 1] + in[idx - sy] + in[idx + sy]
                                        + in[idx - sz] + in[idx + sz]);
    }
    done[idx] = 1;
}
