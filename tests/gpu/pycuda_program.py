"""An ordinary PyCUDA program, with no R³ code in it: what the capture test records.

Run on its own it checks its own result; under ``r3 record pycuda`` the same lines run
with the capture installed.
"""

import numpy as np
import pycuda.autoinit  # noqa: F401  (creates the context)
import pycuda.driver as drv
import pycuda.gpuarray as gpuarray
from pycuda.compiler import SourceModule

module = SourceModule("""
__device__ int calls;

__global__ void scale_add(float* out, const float* x, const float* y, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) {
        atomicAdd(&calls, 1);
    }
    if (i < n) {
        out[i] = a * x[i] + y[i];
    }
}
""")
scale_add = module.get_function("scale_add")

n = 100_000
rng = np.random.default_rng(1)
x = gpuarray.to_gpu(rng.random(n, dtype=np.float32))
y = gpuarray.to_gpu(rng.random(n, dtype=np.float32))
out = gpuarray.empty_like(x)
grid = ((n + 255) // 256, 1)
for _ in range(5):
    scale_add(out, x, y, np.float32(2.0), np.int32(n), block=(256, 1, 1), grid=grid)

# The prepared interface, another block shape.
scale_add.prepare("PPPfi")
scale_add.prepared_call(((n + 127) // 128, 1), (128, 1, 1), out.gpudata, x.gpudata, y.gpudata,
                        3.0, n)

# A raw allocation from mem_alloc, passed as a kernel argument.
copy = drv.mem_alloc(x.nbytes)
drv.memcpy_dtod(copy, x.gpudata, x.nbytes)
scale_add(out, copy, y, np.float32(0.5), np.int32(n), block=(256, 1, 1), grid=grid)

result = out.get()
assert np.allclose(result, 0.5 * x.get() + y.get()), "wrong result"
print("pycuda program ok")
