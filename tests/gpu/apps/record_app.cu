// A small unmodified CUDA program for `r3 record -- ./app` tests (tests/gpu/test_gpu_app_record.py).
// Build both linkages:
//   nvcc -arch=sm_90 -cudart=shared -o record_app_shared record_app.cu
//   nvcc -arch=sm_90 -o record_app_static record_app.cu          (default: static runtime)
// Kernels: one that follows pointers stored in a struct in device memory, one that takes a
// 12-byte struct by value, one that reads a __device__ global set with cudaMemcpyToSymbol,
// and one launched on managed memory (which recording must report as not replayable).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

struct Pairs { const float *x; float *y; float a; };
struct Params { float scale; int offset; int stride; };  // 12 bytes by value

__device__ float g_bias;

__global__ void follow_pairs(const Pairs *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p->y[i] = p->a * p->x[i] + p->y[i];
}

__global__ void by_value(Params q, const float *in, float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = q.scale * in[(i * q.stride + q.offset) % n];
}

__global__ void with_global(float *v, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] += g_bias;
}

__global__ void on_managed(float *m, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) m[i] = m[i] * 2.0f + 1.0f;
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100000;
    size_t bytes = n * sizeof(float);
    float *h = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 97) * 0.25f;
    float *x, *y, *out;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMalloc(&out, bytes));
    CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, h, bytes, cudaMemcpyHostToDevice));
    Pairs hp = {x, y, 1.5f};
    Pairs *dp;
    CHECK(cudaMalloc(&dp, sizeof hp));
    CHECK(cudaMemcpy(dp, &hp, sizeof hp, cudaMemcpyHostToDevice));
    int block = 256, grid = (n + block - 1) / block;
    for (int it = 0; it < 3; it++) follow_pairs<<<grid, block>>>(dp, n);
    Params q = {0.5f, 3, 7};
    // the L1/shared split an application may ask for: recorded, and set in every replay
    CHECK(cudaFuncSetAttribute(by_value, cudaFuncAttributePreferredSharedMemoryCarveout, 25));
    CHECK(cudaFuncSetCacheConfig(with_global, cudaFuncCachePreferL1));
    by_value<<<grid, block>>>(q, y, out, n);
    by_value<<<grid / 2 + 1, 2 * block>>>(q, out, x, n);
    float bias = 0.75f;
    CHECK(cudaMemcpyToSymbol(g_bias, &bias, sizeof bias));
    with_global<<<grid, block>>>(out, n);
    float *m;
    CHECK(cudaMallocManaged(&m, bytes));
    for (int i = 0; i < n; i++) m[i] = (float)i;
    on_managed<<<grid, block>>>(m, n);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(h, out, bytes, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; i++) sum += h[i] + m[i];
    printf("checksum %.6e\n", sum);
    CHECK(cudaFree(m));
    CHECK(cudaFree(dp));
    CHECK(cudaFree(out));
    CHECK(cudaFree(y));
    CHECK(cudaFree(x));
    free(h);
    return 0;
}
