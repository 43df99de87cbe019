// Compiles slowly on purpose (about a minute with NVRTC 13.0 on 2 cores): the fully unrolled
// loop gives ptxas a very long straight-line program. The pool tests kill it long before.
#ifndef SLOW_STEPS
#define SLOW_STEPS 1024
#endif
extern "C" __global__ void slow(const float* __restrict__ in, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float acc = in[i];
#pragma unroll
    for (int s = 0; s < SLOW_STEPS; ++s) {
        acc = acc * in[(i + s * 7) % n] + sinf(acc + s);
    }
    out[i] = acc;
}
