// Never finishes: two volatile reads of the same (non-NaN) value always compare equal, and
// volatile accesses are side effects, so the compiler may not remove the loop.
extern "C" __global__ void axpy(const double* x, double* y, int n, double a)
{
    volatile double* v = y;
    while (v[0] == v[0]) {
    }
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
