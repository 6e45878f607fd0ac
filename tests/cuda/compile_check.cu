// Every kernel header (kvfuse/cuda.cuh) and the KVFUSE_HOST_DEVICE element math compile under nvcc for
// sm_90 (+ PTX) in one translation unit, and the element math's host instantiation
// in this nvcc translation unit gives the value computed by hand. The kernel is compiled, not launched,
// so this runs without a GPU.
#include <cstdio>
#include <string_view>

#include "kvfuse/cuda.cuh"
#include "kvfuse/detail/kv_deviation.hpp"

namespace {
__global__ void deviation_kernel(const float* recomputed, const float* cached, std::int64_t row_stride,
                                 std::int64_t rows, std::int64_t heads, std::int64_t head_dim, float* out) {
  const std::int64_t row = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (row < rows) out[row] = kvfuse::detail::kv_token_deviation(recomputed, cached, row_stride, row, heads, head_dim);
}
}  // namespace

int main() {
  (void)&deviation_kernel;
  // One token, 2 heads x 2 dims: (1-0)^2 + (2-0)^2 + (0-3)^2 + (4-4)^2 = 14.
  const float recomputed[4] = {1, 2, 0, 4};
  const float cached[4] = {0, 0, 3, 4};
  if (kvfuse::detail::kv_token_deviation(recomputed, cached, 4, 0, 2, 2) != 14.0f) {
    std::puts("host path of kv_token_deviation under nvcc is wrong");
    return 1;
  }
  if (kvfuse::cuda::from_cuda(cudaErrorInvalidValue) != kvfuse::cuda::Status::cuda_error ||
      std::string_view(kvfuse::cuda::status_string(kvfuse::cuda::Status::unsupported)) != "unsupported configuration") {
    std::puts("kvfuse::cuda::Status mapping is wrong");
    return 1;
  }
  return 0;
}
