// Kernels for the compile-layer tests; each one makes the compiler report one resource.

// The plain case: a handful of registers, nothing else.
extern "C" __global__ void saxpy(float a, const float* __restrict__ x, float* __restrict__ y,
                                 int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

// Static shared memory: 300 floats + 3 doubles = 1200 + 24 = 1224 bytes.
extern "C" __global__ void tile(const float* __restrict__ in, float* __restrict__ out) {
    __shared__ float buf[300];
    __shared__ double extra[3];
    int t = threadIdx.x;
    buf[t % 300] = in[t];
    extra[t % 3] = in[t] * 2.0;
    __syncthreads();
    out[t] = buf[(t + 1) % 300] + (float)extra[(t + 1) % 3];
}

// A per-thread array written at run-time indices cannot live in registers: a 256-byte stack frame.
extern "C" __global__ void local_array(const int* __restrict__ index, const float* __restrict__ in,
                                       float* __restrict__ out) {
    float values[64];
    int t = threadIdx.x;
    for (int j = 0; j < 64; ++j) values[j] = 0.0f;
    for (int j = 0; j < 16; ++j) values[index[t * 16 + j] & 63] += in[j];
    out[t] = values[index[t] & 63];
}

// 32 accumulators live across a loop: more registers than -maxrregcount=32 allows, so spills.
extern "C" __global__ void pressure(const float* __restrict__ in, float* __restrict__ out, int n) {
    float acc[32];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j] = in[i + j * n];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
#pragma unroll
        for (int j = 0; j < 32; ++j) acc[j] = acc[j] * acc[(j + r + 1) % 32] + in[i + (j + r) * n];
    }
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 32; ++j) s += acc[j] * (float)(j + 1);
    out[i] = s;
}

// __launch_bounds__ caps the block size the cubin accepts.
extern "C" __global__ void __launch_bounds__(128) bounded(float* y) {
    y[blockIdx.x * blockDim.x + threadIdx.x] += 1.0f;
}

// A template: compiled through the name expression "axpy<float>" / "axpy<double>".
template <typename T>
__global__ void axpy(T a, const T* __restrict__ x, T* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
