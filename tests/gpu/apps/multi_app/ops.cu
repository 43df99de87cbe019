// A second translation unit: its kernel is defined here, its launcher called from main.cu.
#include <cstdio>
#include "multi/ops.h"

#ifndef SCALE_BLOCK
#define SCALE_BLOCK 128
#endif

namespace {
__device__ float squash(float x) { return x / (1.0f + fabsf(x)); }
}  // namespace

__global__ void scale(float* data, float factor, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
    data[i] = squash(data[i] * factor) + data[i];
}

void scale_on_device(float* data, float factor, int n, int iterations) {
  int blocks = (n + SCALE_BLOCK - 1) / SCALE_BLOCK;
  for (int it = 0; it < iterations; ++it) scale<<<blocks, SCALE_BLOCK>>>(data, factor, n);
  if (cudaDeviceSynchronize() != cudaSuccess) std::fprintf(stderr, "scale failed\n");
}
