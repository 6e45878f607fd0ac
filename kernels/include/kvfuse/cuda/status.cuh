#pragma once
// kvfuse::cuda::Status — what every kvfuse kernel launcher returns. Kernels and launchers never throw
// (engines call them from code that must not unwind through CUDA streams); bad arguments and
// unsupported settings are refused with a status before anything is launched.
//
// Host-only: includes the CUDA runtime API, not device code, so plain C++ translation units may use it.

#include <cuda_runtime_api.h>

namespace kvfuse::cuda {

enum class Status : int {
  success = 0,
  invalid_argument,  // a size, stride, pointer or index is out of range
  unsupported,       // a valid but unsupported setting (dtype, head_dim, scaling, layout)
  cuda_error,        // the CUDA runtime reported an error at launch (see cudaGetLastError)
};

[[nodiscard]] inline const char* status_string(Status s) noexcept {
  switch (s) {
    case Status::success: return "success";
    case Status::invalid_argument: return "invalid argument";
    case Status::unsupported: return "unsupported configuration";
    case Status::cuda_error: return "CUDA runtime error";
  }
  return "unknown kvfuse::cuda::Status";
}

// Status of a launch from the CUDA runtime's error code.
[[nodiscard]] inline Status from_cuda(cudaError_t e) noexcept {
  return e == cudaSuccess ? Status::success : Status::cuda_error;
}

}  // namespace kvfuse::cuda
