// 3-D 7-point Jacobi stencil (one sweep of explicit heat diffusion), double precision.
//
//   out[i,j,k] = c0*in[i,j,k] + c1*(in[i-1] + in[i+1] + in[j-1] + in[j+1] + in[k-1] + in[k+1])
//
// on interior points; boundary points copy ``in`` so every element of ``out`` is written.
// Arrays are x-fastest: idx = (k*ny + j)*nx + i.
//
// Naive on purpose: one thread per point, every neighbour loaded from global memory (no
// shared-memory or register blocking along z), no __restrict__ / __ldg, 64-bit index arithmetic
// for every load, and a cube-shaped default block (8,8,8) whose warps read 64-byte x-segments.
// Correct for any block shape: each thread bounds-checks its (i,j,k).
extern "C" __global__ void stencil7(const double* in, double* out, int nx, int ny, int nz,
                                    double c0, double c1)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int j = blockIdx.y * blockDim.y + threadIdx.y;
    int k = blockIdx.z * blockDim.z + threadIdx.z;
    if (i >= nx || j >= ny || k >= nz) {
        return;
    }
    long long sy = nx;
    long long sz = (long long)nx * ny;
    long long idx = k * sz + j * sy + i;
    if (i == 0 || j == 0 || k == 0 || i == nx - 1 || j == ny - 1 || k == nz - 1) {
        out[idx] = in[idx];
        return;
    }
    out[idx] = c0 * in[idx]
             + c1 * (in[idx - 1] + in[idx + 1] + in[idx - sy] + in[idx + sy] + in[idx - sz]
                     + in[idx + sz]);
}
