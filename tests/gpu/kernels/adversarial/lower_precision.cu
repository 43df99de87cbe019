// Attack: compute in single precision although the buffers are double (half the arithmetic
// cost on most GPUs, and fewer registers).
extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    int k = blockIdx.z * blockDim.z + threadIdx.z;
    if (i >= nx || j >= ny || k >= nz) return;
    long long sy = nx, sz = (long long)nx * ny, idx = k * sz + j * sy + i;
    if (i == 0 || j == 0 || k == 0 || i == nx - 1 || j == ny - 1 || k == nz - 1) {
        out[idx] = in[idx];
        return;
    }
    float s = (float)in[idx - 1] + (float)in[idx + 1] + (float)in[idx - sy] + (float)in[idx + sy]
            + (float)in[idx - sz] + (float)in[idx + sz];
    out[idx] = (double)((float)c0 * (float)in[idx] + (float)c1 * s);
}
