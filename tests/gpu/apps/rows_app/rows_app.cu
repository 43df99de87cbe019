// A CUDA program written for the tests in the shape of Rodinia gaussian's elimination step: a
// 2-D kernel whose x thread index picks a row (so neighbouring lanes of a warp touch different
// rows), launched from a loop with blocks of 4x4 threads built in a dim3 variable, as most of
// the corpus's programs launch (tests/gpu/test_gpu_app_reshape.py).
//   nvcc -O3 -arch=sm_90 -o rows_app rows_app.cu
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

// rows k+1.. of the n x n matrix a less f[row] times row k, from column k on
__global__ void eliminate(const float *f, float *a, int n, int k) {
    if (threadIdx.x + blockIdx.x * blockDim.x >= n - 1 - k) return;
    if (threadIdx.y + blockIdx.y * blockDim.y >= n - k) return;
    int row = blockIdx.x * blockDim.x + threadIdx.x + 1 + k;
    int col = blockIdx.y * blockDim.y + threadIdx.y + k;
    a[n * row + col] -= f[row] * a[n * k + col];
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1024;
    int steps = argc > 2 ? atoi(argv[2]) : 8;
    std::vector<float> a((size_t)n * n), f(n);
    for (size_t i = 0; i < a.size(); i++) a[i] = (float)((i * 7919) % 1000) / 1000.0f;
    for (int i = 0; i < n; i++) f[i] = 1.0f / (float)(i + 2);
    float *d_a, *d_f;
    CHECK(cudaMalloc(&d_a, a.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_f, f.size() * sizeof(float)));
    CHECK(cudaMemcpy(d_a, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_f, f.data(), f.size() * sizeof(float), cudaMemcpyHostToDevice));
    int side = 4;
    dim3 block(side, side), grid((n + side - 1) / side, (n + side - 1) / side);
    for (int k = 0; k < steps; k++) {
        eliminate<<<grid, block>>>(d_f, d_a, n, k);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaMemcpy(a.data(), d_a, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (size_t i = 0; i < a.size(); i++) sum += a[i] * (double)(i % 13 + 1);
    printf("checksum: %.9e\n", sum);
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_f));
    return 0;
}
