// A kernel whose float result depends on the order its blocks run in, as HeCBench jacobi's
// residual does: each block sums its share of squares and adds it to one float with
// atomicAdd.  The values span six orders of magnitude so that the order shows in the last
// bits.  It prints the sum; tests/gpu/test_gpu_order.py records and replays it.
#include <cstdio>
#include <vector>

__global__ void sum_squares(const float *x, float *total, int n) {
    __shared__ float part[256];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] * x[i] : 0.0f;
    part[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(total, part[0]);
}

int main() {
    const int n = 1 << 22;
    std::vector<float> host(n);
    unsigned state = 12345u;
    for (int i = 0; i < n; i++) {
        state = state * 1664525u + 1013904223u;
        float unit = (state >> 8) * (1.0f / 16777216.0f);
        host[i] = unit * ((i % 7 == 0) ? 1000.0f : 1.0f);
    }
    float *x, *total;
    cudaMalloc(&x, n * sizeof(float));
    cudaMalloc(&total, sizeof(float));
    cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    float result = 0.0f;
    for (int rep = 0; rep < 3; rep++) {
        cudaMemset(total, 0, sizeof(float));
        sum_squares<<<n / 256, 256>>>(x, total, n);
        cudaMemcpy(&result, total, sizeof(float), cudaMemcpyDeviceToHost);
    }
    printf("sum %.9g\n", result);
    cudaFree(x);
    cudaFree(total);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
