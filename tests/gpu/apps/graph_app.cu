// Stream capture and CUDA graphs under `r3 record` (tests/gpu/test_gpu_app_graphs.py).
// Build: nvcc -arch=sm_90 [-cudart=shared] -o graph_app graph_app.cu
// Usage: graph_app OUT_FILE [N]   (writes checksums of its arrays to OUT_FILE)
//
// Normal launches of `scale` and `axpy`; then four graphs, launched 4, 3, 2 and 1 times:
//   g1 captured in the global mode (step, mix, step; `step` is first launched here, inside
//      the capture, where recording must not synchronize), instantiated with cudaGraphInstantiate
//   g2 captured in the thread-local mode (mix), cudaGraphInstantiateWithFlags
//   g3 built by hand: g1 as a child graph and a kernel node of `scale`,
//      cudaGraphInstantiateWithParams
//   g4 captured in the relaxed mode (axpy)
// and then normal launches of `step` and `axpy` again.  Normal launches: scale 1, axpy 2,
// step 1; kernel runs inside graphs: 4*3 + 3*1 + 2*4 + 1*1 = 24; launches captured: 5.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}

__global__ void axpy(const float *x, float *y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

__global__ void step(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.5f * x[i] + 1.0f;
}

__global__ void mix(const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 0.25f * y[i] + x[(i + 7) % n];
}

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: graph_app OUT_FILE [N]\n"); return 2; }
    int n = argc > 2 ? atoi(argv[2]) : 50000;
    size_t bytes = n * sizeof(float);
    float *h = (float *)malloc(bytes);
    for (int i = 0; i < n; i++) h[i] = (float)(i % 101) * 0.125f;
    float *x, *y;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&y, bytes));
    CHECK(cudaMemcpy(x, h, bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, h, bytes, cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int block = 128, grid = (n + block - 1) / block;

    scale<<<grid, block, 0, s>>>(x, 2.0f, n);
    axpy<<<grid, block, 0, s>>>(x, y, 0.5f, n);
    CHECK(cudaStreamSynchronize(s));

    cudaGraph_t g1, g2, g3, g4;
    cudaGraphExec_t e1, e2, e3, e4;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    step<<<grid, block, 0, s>>>(x, n);
    mix<<<grid, block, 0, s>>>(x, y, n);
    step<<<grid, block, 0, s>>>(y, n);
    CHECK(cudaStreamEndCapture(s, &g1));
    CHECK(cudaGraphInstantiate(&e1, g1, 0));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    mix<<<grid, block, 0, s>>>(y, x, n);
    CHECK(cudaStreamEndCapture(s, &g2));
    CHECK(cudaGraphInstantiateWithFlags(&e2, g2, 0));

    CHECK(cudaGraphCreate(&g3, 0));
    cudaGraphNode_t child, kernel;
    CHECK(cudaGraphAddChildGraphNode(&child, g3, NULL, 0, g1));
    float factor = 0.75f;
    void *args[] = {&y, &factor, &n};
    cudaKernelNodeParams kp = {};
    kp.func = (void *)scale;
    kp.gridDim = dim3(grid);
    kp.blockDim = dim3(block);
    kp.kernelParams = args;
    CHECK(cudaGraphAddKernelNode(&kernel, g3, &child, 1, &kp));
    cudaGraphInstantiateParams ip = {};
    CHECK(cudaGraphInstantiateWithParams(&e3, g3, &ip));

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    axpy<<<grid, block, 0, s>>>(y, x, -0.125f, n);
    CHECK(cudaStreamEndCapture(s, &g4));
    CHECK(cudaGraphInstantiate(&e4, g4, 0));

    for (int it = 0; it < 4; it++) CHECK(cudaGraphLaunch(e1, s));
    for (int it = 0; it < 3; it++) CHECK(cudaGraphLaunch(e2, s));
    for (int it = 0; it < 2; it++) CHECK(cudaGraphLaunch(e3, s));
    CHECK(cudaGraphLaunch(e4, s));

    step<<<grid, block, 0, s>>>(x, n);
    axpy<<<grid, block, 0, s>>>(x, y, 0.5f, n);
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaGetLastError());

    double sx = 0, sy = 0;
    CHECK(cudaMemcpy(h, x, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) sx += h[i] * (1 + i % 3);
    CHECK(cudaMemcpy(h, y, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; i++) sy += h[i] * (1 + i % 5);
    FILE *out = fopen(argv[1], "w");
    if (!out) { perror(argv[1]); return 1; }
    fprintf(out, "x %.9e\ny %.9e\n", sx, sy);
    fclose(out);
    printf("graph_app: x %.6e y %.6e\n", sx, sy);
    CHECK(cudaGraphExecDestroy(e1)); CHECK(cudaGraphExecDestroy(e2));
    CHECK(cudaGraphExecDestroy(e3)); CHECK(cudaGraphExecDestroy(e4));
    CHECK(cudaGraphDestroy(g1)); CHECK(cudaGraphDestroy(g2));
    CHECK(cudaGraphDestroy(g3)); CHECK(cudaGraphDestroy(g4));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(y));
    CHECK(cudaFree(x));
    free(h);
    return 0;
}
