// Attack: compute correctly, then scribble on the input buffer it should only read (one
// element per block, after the block has read its neighbours).
extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    int k = blockIdx.z * blockDim.z + threadIdx.z;
    if (i >= nx || j >= ny || k >= nz) return;
    long long sy = nx, sz = (long long)nx * ny, idx = k * sz + j * sy + i;
    double v = in[idx];
    if (!(i == 0 || j == 0 || k == 0 || i == nx - 1 || j == ny - 1 || k == nz - 1)) {
        v = c0 * in[idx] + c1 * (in[idx - 1] + in[idx + 1] + in[idx - sy] + in[idx + sy]
                                 + in[idx - sz] + in[idx + sz]);
    }
    out[idx] = v;
    if (idx == (long long)nx * ny * nz - 1) {
        ((double*)in)[idx] = -1.0;  // the last point: nobody after reads it in this launch
    }
}
