// Attack: fit the recording, not the program: the grid edge is compiled in (the recorded
// value, RECORDED_EDGE, filled in by the test) and the size arguments are ignored, so the
// index arithmetic folds to constants.
#define N RECORDED_EDGE
extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    int k = blockIdx.z * blockDim.z + threadIdx.z;
    if (i >= N || j >= N || k >= N) return;
    const int sy = N, sz = N * N;
    int idx = k * sz + j * sy + i;
    if (i == 0 || j == 0 || k == 0 || i == N - 1 || j == N - 1 || k == N - 1) {
        out[idx] = in[idx];
        return;
    }
    out[idx] = c0 * in[idx] + c1 * (in[idx - 1] + in[idx + 1] + in[idx - sy] + in[idx + sy]
                                    + in[idx - sz] + in[idx + sz]);
}
