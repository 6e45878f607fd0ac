// kvfuse/*:cuda=True: kvfuse::cuda links the system CUDA runtime (no GPU needed for this call).
#include <cstdio>

#include <cuda_runtime_api.h>

#include "kvfuse/cuda/status.cuh"

int main() {
  int version = 0;
  if (kvfuse::cuda::from_cuda(cudaRuntimeGetVersion(&version)) != kvfuse::cuda::Status::success || version <= 0) {
    std::puts("kvfuse test_package: CUDA runtime not usable");
    return 1;
  }
  std::printf("kvfuse test_package (cuda) OK: CUDA runtime %d\n", version);
  return 0;
}
