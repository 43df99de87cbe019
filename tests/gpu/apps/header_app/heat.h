// The application's own header: a struct passed by value and a device helper.
#ifndef HEAT_H
#define HEAT_H
#include <heat/params.h>

namespace heat {
struct Field { float *v; int n; };

__device__ inline float relax(const Field f, int i) {
    float left = i > 0 ? f.v[i - 1] : f.v[i];
    float right = i + 1 < f.n ? f.v[i + 1] : f.v[i];
    return f.v[i] + HEAT_ALPHA * (left - 2.0f * f.v[i] + right);
}
}  // namespace heat
#endif
