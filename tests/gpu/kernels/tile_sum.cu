// Per-block sums of CHUNK ints, staged through a dynamic shared-memory tile of TILE ints: the
// kernel the dynamic-shared-memory search dimension is tested with on the GPU.  The tile size
// is a tunable and the launch's dynamic shared memory follows it (`// r3: shared`); the sums are
// exact integers, so every tile size gives the recorded output.  A launch with less dynamic
// shared memory than the tile needs traps instead of silently reading past the allocation
// (%dynamic_smem_size is the size the launch actually passed).  TILE=16384 needs 64 KiB, more
// than the 48 KiB a launch gets without the device's shared-memory opt-in.
// r3: tune TILE 256 1024 4096 16384
// r3: shared TILE * 4
#ifndef TILE
#define TILE 256
#endif
#define CHUNK 16384

extern "C" __global__ void tile_sum(const int* x, int* out, int n)
{
    extern __shared__ int tile[];
    unsigned int dynamic_bytes;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    if (dynamic_bytes < TILE * sizeof(int)) {
        __trap();
    }
    long long base = (long long)blockIdx.x * CHUNK;
    int acc = 0;
    for (int start = 0; start < CHUNK; start += TILE) {
        for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
            long long g = base + start + i;
            tile[i] = g < n ? x[g] : 0;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 0; i < TILE; ++i) {
                acc += tile[i];
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = acc;
    }
}
