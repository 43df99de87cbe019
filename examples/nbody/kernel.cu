// All-pairs gravitational accelerations and potentials with Plummer softening, float32 (G = 1).
//
//   acc[i].xyz = sum_j m_j (p_j - p_i) / (|p_j - p_i|^2 + eps2)^(3/2)
//   acc[i].w   = -sum_j m_j / (|p_j - p_i|^2 + eps2)^(1/2)      (the j == i term included)
//
// pos[j] = (x, y, z, mass).  Naive O(N^2): one thread per body streams every other body from
// global memory (no shared-memory tiling of the j loop), uses an IEEE sqrtf and two divisions
// per pair instead of one rsqrtf, keeps the loop rolled, and runs one thread per body, so with a
// few tens of thousands of bodies only a fraction of the GPU's thread slots are busy.
// Headroom: shared-memory tiles of bodies, rsqrtf / fast-math, unrolling, splitting the j loop
// over several threads per body, a block size that fills every SM.
// Correct for any block shape: the body index is bounds-checked.
extern "C" __global__ void nbody(const float4* pos, float4* acc, int n, float eps2)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    float4 pi = pos[i];
    float ax = 0.0f;
    float ay = 0.0f;
    float az = 0.0f;
    float phi = 0.0f;
    for (int j = 0; j < n; ++j) {
        float4 pj = pos[j];
        float dx = pj.x - pi.x;
        float dy = pj.y - pi.y;
        float dz = pj.z - pi.z;
        float r2 = dx * dx + dy * dy + dz * dz + eps2;
        float r = sqrtf(r2);
        float inv_r = 1.0f / r;
        float s = pj.w / (r2 * r);
        ax += dx * s;
        ay += dy * s;
        az += dz * s;
        phi -= pj.w * inv_r;
    }
    acc[i] = make_float4(ax, ay, az, phi);
}
