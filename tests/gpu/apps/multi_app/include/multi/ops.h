#pragma once
// Host entry points of ops.cu, a second translation unit.
void scale_on_device(float* data, float factor, int n, int iterations);
