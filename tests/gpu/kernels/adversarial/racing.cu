// Attack: update in place with whatever the neighbours' threads have written so far (a
// Gauss-Seidel sweep in one launch): fewer loads from `in`, and a result that depends on
// which blocks ran first.
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
    volatile double* o = out;
    double left = o[idx - 1] > 0.0 ? o[idx - 1] : in[idx - 1];
    double below = o[idx - sz] > 0.0 ? o[idx - sz] : in[idx - sz];
    out[idx] = c0 * in[idx] + c1 * (left + in[idx + 1] + in[idx - sy] + in[idx + sy]
                                    + below + in[idx + sz]);
}
