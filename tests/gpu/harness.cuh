#pragma once
// A small test harness for the GPU tests (tests/gpu/*.cu, CTest label `gpu`). Each .cu file is one
// binary: it registers cases with KVFUSE_GPU_TEST, and this header's main() runs them. Without a CUDA
// device main() prints why and exits 77, which CTest reports as skipped.
//
// No doctest here on purpose: the same files are built by hand with nvcc on a lent GPU machine
// (scripts/bench_kernels.sh), where only the CUDA toolkit is installed.
//
// Conventions the cases follow (docs/kernels.md): fresh random inputs every run (the seed is printed),
// outputs poisoned with NaN bytes before each launch, results compared with an fp64 CPU reference by
// ||out - ref|| / ||ref||, and NaN never passes.

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/status.hpp"

namespace kvfuse::gpu_test {

struct Case {
  const char* name;
  void (*run)();
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

inline int& failures() {
  static int count = 0;
  return count;
}

struct Register {
  Register(const char* name, void (*run)()) { registry().push_back({name, run}); }
};

// The seed of this run: KVFUSE_GPU_TEST_SEED if set, else fresh from std::random_device.
inline std::uint64_t seed() {
  static const std::uint64_t value = []() -> std::uint64_t {
    if (const char* s = std::getenv("KVFUSE_GPU_TEST_SEED")) return std::strtoull(s, nullptr, 10);
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) | rd();
  }();
  return value;
}

// The largest problem size a test should run: KVFUSE_GPU_TEST_MAX_N if set (for slow tools such as
// compute-sanitizer's racecheck, whose hazards show at any size with several blocks), else no limit.
inline std::int64_t max_n() {
  static const std::int64_t value = []() -> std::int64_t {
    if (const char* s = std::getenv("KVFUSE_GPU_TEST_MAX_N")) return std::strtoll(s, nullptr, 10);
    return INT64_MAX;
  }();
  return value;
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 engine(seed());
  return engine;
}

inline void fail(const char* file, int line, const std::string& what) {
  ++failures();
  std::printf("  FAILED %s:%d: %s\n", file, line, what.c_str());
}

// Formats like printf into a std::string.
#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
inline std::string strf(const char* format, ...) {
  char buffer[1024];
  std::va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof buffer, format, args);
  va_end(args);
  return buffer;
}

// ||got - ref|| / ||ref|| over all elements; +inf if any element of `got` is not finite where ref is.
inline double relative_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double diff = 0;
  double norm = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) return INFINITY;
    diff += (got[i] - ref[i]) * (got[i] - ref[i]);
    norm += ref[i] * ref[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Owning device buffer of `count` elements of T.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t count) : count_(count) {
    if (count_ > 0 && cudaMalloc(&data_, count_ * sizeof(T)) != cudaSuccess) {
      std::printf("cudaMalloc of %zu bytes failed\n", count_ * sizeof(T));
      std::exit(1);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(data_); }

  T* data() const { return data_; }
  std::size_t size() const { return count_; }

  void upload(const std::vector<T>& host) {
    cudaMemcpy(data_, host.data(), std::min(host.size(), count_) * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> host(count_);
    cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  // Every byte 0xFF: a NaN in f32, f16 and bf16, and -1 / UINT_MAX in integers, so an element a kernel
  // fails to write shows up.
  void poison() { cudaMemset(data_, 0xFF, count_ * sizeof(T)); }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

// Uniform random values in [lo, hi) rounded to storage type T.
template <class T>
std::vector<T> random_values(std::size_t count, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> values(count);
  for (auto& v : values) v = kvfuse::from_float<T>(dist(rng()));
  return values;
}

template <class T>
std::vector<double> to_double(const std::vector<T>& values) {
  std::vector<double> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = static_cast<double>(kvfuse::to_float(values[i]));
  return out;
}

}  // namespace kvfuse::gpu_test

#define KVFUSE_GPU_CAT2(a, b) a##b
#define KVFUSE_GPU_CAT(a, b) KVFUSE_GPU_CAT2(a, b)
#define KVFUSE_GPU_TEST(name)                                                                         \
  static void KVFUSE_GPU_CAT(kvfuse_gpu_case_, __LINE__)();                                           \
  static const ::kvfuse::gpu_test::Register KVFUSE_GPU_CAT(kvfuse_gpu_register_, __LINE__)(          \
      name, &KVFUSE_GPU_CAT(kvfuse_gpu_case_, __LINE__));                                             \
  static void KVFUSE_GPU_CAT(kvfuse_gpu_case_, __LINE__)()

// Checks a condition; on failure prints the printf-style message and counts a failure (the case goes on).
#define KVFUSE_GPU_CHECK(cond, ...)                                                                   \
  do {                                                                                                \
    if (!(cond)) ::kvfuse::gpu_test::fail(__FILE__, __LINE__, ::kvfuse::gpu_test::strf(__VA_ARGS__)); \
  } while (0)

// A CUDA runtime call that must succeed; on failure the case stops.
#define KVFUSE_GPU_CUDA(call)                                                                         \
  do {                                                                                                \
    const cudaError_t kvfuse_err_ = (call);                                                           \
    if (kvfuse_err_ != cudaSuccess) {                                                                 \
      ::kvfuse::gpu_test::fail(__FILE__, __LINE__,                                                    \
                               ::kvfuse::gpu_test::strf("%s: %s", #call, cudaGetErrorString(kvfuse_err_))); \
      return;                                                                                         \
    }                                                                                                 \
  } while (0)

// A kvfuse launcher that must succeed; on failure the case stops.
#define KVFUSE_GPU_OK(call)                                                                           \
  do {                                                                                                \
    const ::kvfuse::Status kvfuse_st_ = (call);                                                       \
    if (kvfuse_st_ != ::kvfuse::Status::success) {                                                    \
      ::kvfuse::gpu_test::fail(__FILE__, __LINE__,                                                    \
                               ::kvfuse::gpu_test::strf("%s: %s (%s)", #call,                        \
                                                        ::kvfuse::status_string(kvfuse_st_),         \
                                                        ::kvfuse::last_status_message()));           \
      return;                                                                                         \
    }                                                                                                 \
  } while (0)

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t err = cudaGetDeviceCount(&devices);
  if (err != cudaSuccess || devices == 0) {
    std::printf("no CUDA device (%s): GPU tests skipped\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "device count 0");
    return 77;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const char* only = argc > 1 ? argv[1] : nullptr;  // optional substring filter on case names
  std::printf("%s on %s (sm_%d%d), seed %llu\n", argv[0], prop.name, prop.major, prop.minor,
              static_cast<unsigned long long>(kvfuse::gpu_test::seed()));
  int run = 0;
  for (const auto& c : kvfuse::gpu_test::registry()) {
    if (only != nullptr && std::strstr(c.name, only) == nullptr) continue;
    const int before = kvfuse::gpu_test::failures();
    c.run();
    const cudaError_t sticky = cudaDeviceSynchronize();
    if (sticky != cudaSuccess) kvfuse::gpu_test::fail(__FILE__, __LINE__, cudaGetErrorString(sticky));
    std::printf("[%s] %s\n", kvfuse::gpu_test::failures() == before ? "ok" : "FAILED", c.name);
    ++run;
  }
  std::printf("%d cases, %d failed checks\n", run, kvfuse::gpu_test::failures());
  return kvfuse::gpu_test::failures() == 0 && run > 0 ? 0 : 1;
}
