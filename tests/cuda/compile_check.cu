// Compiles the KVFUSE_HOST_DEVICE element math under nvcc for sm_90 and checks the host path agrees
// with what the device path would run (same function).
#include <cstdio>

#include "kvfuse/core/config.hpp"

namespace {
KVFUSE_HOST_DEVICE float axpy(float a, float x, float y) { return a * x + y; }

__global__ void axpy_kernel(float a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = axpy(a, x[i], y[i]);
}
}  // namespace

int main() {
  // Only the host instantiation runs here; the kernel is compiled (and would be launched on a GPU).
  (void)&axpy_kernel;
  if (axpy(2.0f, 3.0f, 1.0f) != 7.0f) {
    std::puts("host path of KVFUSE_HOST_DEVICE function is wrong");
    return 1;
  }
  return 0;
}
