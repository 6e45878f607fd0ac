#pragma once
// Helpers the unit tests share (one definition each): random floats, the largest element-wise difference of two
// float sequences, whether the last kernel-launcher refusal message names a value, and a temporary directory.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <doctest/doctest.h>

#include "kvfuse/core/status.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse_test {

// True in the sanitizer builds (ASan, TSan): a randomized property test draws fewer trials there. The sanitizers
// check the code paths, which a few dozen trials reach; the full sample runs in the optimized build (ci preset).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// Tokens 1000, 1001, ...: n distinct ids for tests that need a prompt but not a model.
inline std::vector<kvfuse::token_id> iota_tokens(std::int64_t n) {
  std::vector<kvfuse::token_id> t(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<kvfuse::token_id>(1000 + i);
  return t;
}

// n floats uniform in [-1, 1) from rng.
inline std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// A row-major k x n matrix as the first n columns of a k x `columns` one whose other columns hold `fill`.
inline std::vector<float> widened(const std::vector<float>& m, std::int64_t k, std::int64_t n, std::int64_t columns,
                                  float fill) {
  std::vector<float> w(static_cast<std::size_t>(k * columns), fill);
  for (std::int64_t p = 0; p < k; ++p)
    for (std::int64_t j = 0; j < n; ++j)
      w[static_cast<std::size_t>(p * columns + j)] = m[static_cast<std::size_t>(p * n + j)];
  return w;
}

// max_i |a_i − b_i| in double; the sizes must match.
inline double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
}

// The largest element-wise difference of two sequences and the largest magnitude of the second; rounding():
// equal up to float rounding (|a − b| ≤ 1e-5 · max(1, max |b|)), for results computed in another order.
struct Diff {
  double max_abs = 0;
  double scale = 1;
  [[nodiscard]] bool rounding() const { return max_abs <= 1e-5 * scale; }
};

template <class A, class B>
Diff diff(const A& a, const B& b) {
  REQUIRE(a.size() == b.size());
  Diff d;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d.max_abs = std::max(d.max_abs, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    d.scale = std::max(d.scale, std::fabs(static_cast<double>(b[i])));
  }
  return d;
}

// True when kvfuse::last_status_message() contains `needle`; otherwise says what the message was.
inline bool message_has(std::string_view needle) {
  const std::string message = kvfuse::last_status_message();
  if (message.find(needle) == std::string::npos) {
    MESSAGE("message \"" << message << "\" lacks \"" << std::string(needle) << "\"");
    return false;
  }
  return true;
}

// A fresh directory under the system's temporary directory, removed with everything in it at scope exit.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("kvfuse-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace kvfuse_test
