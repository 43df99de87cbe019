// A CUDA program that launches one kernel with a new grid on every iteration, as Rodinia lud
// does (its work shrinks as the factorization proceeds): 40 launches, 40 launch
// configurations, on a 64 MiB buffer (tests/gpu/test_gpu_app_bounds.py).  `r3 record`
// snapshots only the first --max-configs of them and counts and times all 40.  It prints its
// own timer around the loop, as lud does, so recording's overhead can be read off.
//   nvcc -arch=sm_90 -o grids_app grids_app.cu
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

// the first n elements of v, in place: each launch reads what the launch before it wrote
__global__ void shrink(float *v, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = a * v[i] + 1.0f / (1.0f + (float)(i & 1023));
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 16 << 20;  // 64 MiB of floats
    int iterations = argc > 2 ? atoi(argv[2]) : 40;
    size_t bytes = (size_t)n * sizeof(float);
    float *h = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 17);
    float *v;
    CHECK(cudaMalloc(&v, bytes));
    CHECK(cudaMemcpy(v, h, bytes, cudaMemcpyHostToDevice));
    const int block = 256;
    CHECK(cudaDeviceSynchronize());
    auto start = std::chrono::steady_clock::now();
    for (int it = 0; it < iterations; it++) {
        int m = n - it * (n / (iterations + 1));  // a smaller grid every iteration
        shrink<<<(m + block - 1) / block, block>>>(v, m, 0.5f + 0.01f * it);
    }
    CHECK(cudaDeviceSynchronize());
    double ms = std::chrono::duration<double, std::milli>(
        std::chrono::steady_clock::now() - start).count();
    CHECK(cudaMemcpy(h, v, bytes, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) sum += h[i];
    printf("checksum %.6e\nloop_ms %.3f\n", sum, ms);
    CHECK(cudaFree(v));
    free(h);
    return 0;
}
