// Compiles, runs, and is wrong: one element in every 1000 is off by one.
extern "C" __global__ void axpy(const double* x, double* y, int n, double a)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i] + (i % 1000 == 7 ? 1.0 : 0.0);
    }
}
