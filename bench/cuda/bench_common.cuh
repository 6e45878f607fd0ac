#pragma once
// Timing helpers for the kernel benchmarks (bench/cuda/*.cu, run on a lent GPU by
// scripts/bench_kernels.sh): CUDA events around each launch, warm-up first, the median of many
// repetitions, and the device-to-device copy bandwidth of the same buffers measured in the same run,
// which bandwidth-bound kernels are reported against. Prints plain tables (one row per configuration).

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace kvfuse::bench {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Median time in milliseconds of `launch` (which enqueues work on `stream`) over `reps` timed runs
// after `warmup` untimed ones; each run is timed with its own pair of events.
inline double median_ms(const std::function<void()>& launch, cudaStream_t stream = nullptr, int warmup = 5,
                        int reps = 50) {
  for (int i = 0; i < warmup; ++i) launch();
  cuda_check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<cudaEvent_t> start(reps), stop(reps);
  for (int i = 0; i < reps; ++i) {
    cuda_check(cudaEventCreate(&start[i]), "cudaEventCreate");
    cuda_check(cudaEventCreate(&stop[i]), "cudaEventCreate");
  }
  for (int i = 0; i < reps; ++i) {
    cuda_check(cudaEventRecord(start[i], stream), "cudaEventRecord");
    launch();
    cuda_check(cudaEventRecord(stop[i], stream), "cudaEventRecord");
  }
  cuda_check(cudaStreamSynchronize(stream), "timed runs");
  cuda_check(cudaGetLastError(), "a timed launch");
  std::vector<double> ms(reps);
  for (int i = 0; i < reps; ++i) {
    float t = 0;
    cuda_check(cudaEventElapsedTime(&t, start[i], stop[i]), "cudaEventElapsedTime");
    ms[i] = t;
    cudaEventDestroy(start[i]);
    cudaEventDestroy(stop[i]);
  }
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[reps / 2];
}

// Median time of copying `bytes` device to device (bytes read + bytes written = 2 * bytes).
inline double copy_ms(void* dst, const void* src, std::size_t bytes, cudaStream_t stream = nullptr) {
  return median_ms([&] { cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "copy"); },
                   stream);
}

inline void print_device() {
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("# device: %s, %d SMs, %.0f MB L2\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6);
}

}  // namespace kvfuse::bench
