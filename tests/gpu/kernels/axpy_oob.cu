// Writes 512 GiB past y: far outside any mapping, so the launch dies with an illegal address
// and the context is poisoned.
extern "C" __global__ void axpy(const double* x, double* y, int n, double a)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i + (1ll << 36)] = a * x[i] + y[i];
    }
}
