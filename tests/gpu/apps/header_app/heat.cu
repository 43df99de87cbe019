// A CUDA program whose kernel needs the application's own headers (tests/gpu/test_gpu_app_headers.py):
// heat.h beside it (which includes "include/heat/params.h" through -Iinclude as <heat/params.h>).
// Build: nvcc -arch=sm_90 -Iinclude -o heat heat.cu
// Usage: heat OUT_FILE [N]   (writes a checksum of the field to OUT_FILE)
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include "heat.h"

namespace heat {
__global__ void diffuse(const Field in, Field out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < in.n) out.v[i] = relax(in, i);
}
}  // namespace heat

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: heat OUT_FILE [N]\n"); return 2; }
    int n = argc > 2 ? atoi(argv[2]) : 40000;
    size_t bytes = n * sizeof(float);
    float *h = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) h[i] = (i % 257 == 0) ? 100.0f : 0.0f;
    heat::Field a = {nullptr, n}, b = {nullptr, n};
    CHECK(cudaMalloc(&a.v, bytes));
    CHECK(cudaMalloc(&b.v, bytes));
    CHECK(cudaMemcpy(a.v, h, bytes, cudaMemcpyHostToDevice));
    int block = HEAT_BLOCK, grid = (n + block - 1) / block;
    for (int it = 0; it < 10; it++) {
        heat::diffuse<<<grid, block>>>(it % 2 ? b : a, it % 2 ? a : b);
    }
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, a.v, bytes, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) sum += h[i] * (1 + i % 7);
    FILE *out = fopen(argv[1], "w");
    if (!out) { perror(argv[1]); return 1; }
    fprintf(out, "%.9e\n", sum);
    fclose(out);
    CHECK(cudaFree(b.v));
    CHECK(cudaFree(a.v));
    free(h);
    return 0;
}
