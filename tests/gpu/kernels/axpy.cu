// y = a*x + y over n doubles: the small recording the containment tests replay bad kernels on.
extern "C" __global__ void axpy(const double* x, double* y, int n, double a)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i] + y[i];
    }
}
