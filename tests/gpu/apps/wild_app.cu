// A CUDA program whose kernel writes through a wild pointer (tests/gpu/test_gpu_app_faults.py).
// Like the program in issue 18 it does not check errors after its launches: it goes on
// launching `scale` 50 times into the faulted context, and only its final synchronization
// reports the error.  It never captures a stream into a CUDA graph.
//   nvcc -arch=sm_90 -o wild_app wild_app.cu
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void scale(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i] + 1.0f;
}

__global__ void wild_write(float *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[(size_t)i * 1024] = 1.0f;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 4096;
    size_t bytes = n * sizeof(float);
    float *h = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 7);
    float *x;
    if (cudaMalloc(&x, bytes) != cudaSuccess) return 1;
    cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice);
    int block = 128, grid = (n + block - 1) / block;
    scale<<<grid, block>>>(x, n);
    scale<<<grid, block>>>(x, n);
    wild_write<<<grid, block>>>((float *)(uintptr_t)0x1000, n);
    for (int it = 0; it < 50; it++) scale<<<grid, block>>>(x, n);
    cudaError_t e = cudaDeviceSynchronize();
    printf("synchronize: %s\n", cudaGetErrorString(e));
    free(h);
    return e == cudaSuccess ? 0 : 1;
}
