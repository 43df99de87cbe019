// A CUDA program whose kernel reads a few elements before and after its buffers, as some real
// stencils do at their edges (tests/gpu/test_gpu_app_faults.py).  In a plain run the driver's
// allocator has memory mapped around a buffer and the reads are harmless; under `r3 record`
// the arena's guard space keeps them harmless, and with --guard-bytes 0 the read before the
// first allocation (at the arena's base) faults.
//   nvcc -arch=sm_90 -o guard_app guard_app.cu
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

// in[i - 4] and in[i + 4] for every i: four elements before `in` and four after it are read
__global__ void smooth(const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 0.25f * in[i - 4] + 0.5f * in[i] + 0.25f * in[i + 4];
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4096;
    size_t bytes = n * sizeof(float);
    float *h = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 13) + 1.0f;
    float *in, *out;
    CHECK(cudaMalloc(&in, bytes));  // the first allocation: at the start of R3's arena
    CHECK(cudaMalloc(&out, bytes));
    CHECK(cudaMemcpy(in, h, bytes, cudaMemcpyHostToDevice));
    int block = 128, grid = (n + block - 1) / block;
    for (int it = 0; it < 3; it++) smooth<<<grid, block>>>(in, out, n);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 4; i < n - 4; i++) sum += h[i];  // the edges read memory the program does not own
    printf("checksum %.6e\n", sum);
    CHECK(cudaFree(out));
    CHECK(cudaFree(in));
    free(h);
    return 0;
}
