// Attack: fit the recording's data: write the recorded sum (its bits, RECORDED_SUM_BITS,
// filled in by the test) without reading the input at all.
extern "C" __global__ void reduce_sum(const float* x, double* out, int n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
        *out = __longlong_as_double(RECORDED_SUM_BITS);
    }
}
