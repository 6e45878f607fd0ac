// Links kvfuse::cuda from a host-only program: the CUDA runtime it brings must resolve. Needs no GPU
// (cudaRuntimeGetVersion does not touch a device).
#include <cstdio>

#include <cuda_runtime_api.h>

#include "kvfuse/core/config.hpp"
#include "kvfuse/cuda/status.cuh"

int main() {
  int version = 0;
  if (kvfuse::cuda::from_cuda(cudaRuntimeGetVersion(&version)) != kvfuse::cuda::Status::success || version <= 0) {
    std::puts("kvfuse::cuda: CUDA runtime not usable");
    return 1;
  }
  std::printf("kvfuse::cuda consumer OK (CUDA runtime %d)\n", version);
  return 0;
}
