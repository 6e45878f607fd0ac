#pragma once
// kvfuse::cuda::Status — kvfuse::Status (core/status.hpp), what every kvfuse kernel launcher returns,
// plus the mapping from the CUDA runtime's error codes. Launchers never throw; a refusal names the bad
// value in kvfuse::last_status_message().
//
// Host-only: includes the CUDA runtime API, not device code, so plain C++ translation units may use it.

#include <cuda_runtime_api.h>

#include "kvfuse/core/status.hpp"

namespace kvfuse::cuda {

using kvfuse::last_status_message;
using kvfuse::Status;
using kvfuse::status_string;

// Status of a CUDA runtime call; an error is recorded as "<what>: <CUDA's error string>".
[[nodiscard]] inline Status from_cuda(cudaError_t e, const char* what = "CUDA runtime") noexcept {
  if (e == cudaSuccess) return Status::success;
  return refuse(Status::cuda_error, "%s: %s", what, cudaGetErrorString(e));
}

// Status of the launch just made (cudaGetLastError), for launchers to return.
[[nodiscard]] inline Status launch_status(const char* kernel) noexcept { return from_cuda(cudaGetLastError(), kernel); }

}  // namespace kvfuse::cuda
