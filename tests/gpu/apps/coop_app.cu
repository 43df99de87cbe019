// A kernel that synchronizes its whole grid (cooperative groups' grid.sync()), launched with
// cudaLaunchCooperativeKernel: each block writes its partial sum, the grid synchronizes, and
// block 0 adds the partials.  Written for R³'s tests: the recorder must see the launch and
// the replay launch it cooperatively, or grid.sync() has no meaning.
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>

namespace cg = cooperative_groups;

__global__ void two_phase_sum(const float *x, float *partial, float *total, int n) {
    cg::grid_group grid = cg::this_grid();
    __shared__ float acc[256];
    float mine = 0.0f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        mine += x[i];
    acc[threadIdx.x] = mine;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) acc[threadIdx.x] += acc[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = acc[0];
    grid.sync();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        float t = 0.0f;
        for (int b = 0; b < gridDim.x; ++b) t += partial[b];
        *total = t;
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1 << 20;
    float *x, *partial, *total;
    int blocks = 64, threads = 256;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&partial, blocks * sizeof(float));
    cudaMalloc(&total, sizeof(float));
    float *h = (float *)malloc(n * sizeof(float));
    for (int i = 0; i < n; ++i) h[i] = (float)(i % 7) * 0.5f;
    cudaMemcpy(x, h, n * sizeof(float), cudaMemcpyHostToDevice);
    void *args[] = {&x, &partial, &total, &n};
    for (int it = 0; it < 3; ++it)
        if (cudaLaunchCooperativeKernel((void *)two_phase_sum, blocks, threads, args) !=
            cudaSuccess) {
            fprintf(stderr, "cooperative launch failed\n");
            return 1;
        }
    float t = 0.0f;
    cudaMemcpy(&t, total, sizeof t, cudaMemcpyDeviceToHost);
    printf("total: %.1f\n", t);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
