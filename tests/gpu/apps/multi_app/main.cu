// A small multi-file application written for R3's tests: host code with the standard
// library, a templated kernel from a header, a kernel in another translation unit.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "multi/ops.h"
#include "multi/stencil.cuh"

#ifndef SMOOTH_BLOCK
#define SMOOTH_BLOCK 256
#endif

static double reference_sum(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  return s;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : (1 << 22);
  int steps = argc > 2 ? std::atoi(argv[2]) : 20;
  auto start = std::chrono::steady_clock::now();
  std::vector<float> host(n);
  for (int i = 0; i < n; ++i) host[i] = std::sin(0.001f * i);
  float *a = nullptr, *b = nullptr;
  cudaMalloc(&a, n * sizeof(float));
  cudaMalloc(&b, n * sizeof(float));
  cudaMemcpy(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  multi::Field field{n};
  int blocks = (n + SMOOTH_BLOCK - 1) / SMOOTH_BLOCK;
  auto solve = std::chrono::steady_clock::now();
  for (int s = 0; s < steps; ++s) {
    multi::smooth<float, RADIUS><<<blocks, SMOOTH_BLOCK>>>(a, b, field);
    multi::smooth<float, RADIUS><<<blocks, SMOOTH_BLOCK>>>(b, a, field);
  }
  scale_on_device(a, 0.5f, n, steps);
  // a second configuration of `scale` (a quarter of the elements, its own grid): what
  // r3 apply ships for the kernel changes these launches too
  scale_on_device(b, 0.25f, n / 4, steps / 2 + 1);
  cudaMemcpy(host.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost);
  double solve_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - solve).count();
  double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("checksum: %.6e\n", reference_sum(host));
  std::printf("solve_time_s: %.6f\n", solve_s);
  std::printf("wall_time_s: %.6f\n", wall_s);
  cudaFree(a);
  cudaFree(b);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}
