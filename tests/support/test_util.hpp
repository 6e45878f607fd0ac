#pragma once
// Helpers the unit tests share (one definition each): the largest element-wise difference of two float
// sequences, and whether the last kernel-launcher refusal message names a value.
#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <string_view>

#include <doctest/doctest.h>

#include "kvfuse/core/status.hpp"

namespace kvfuse_test {

// max_i |a_i − b_i| in double; the sizes must match.
inline double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  return m;
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

}  // namespace kvfuse_test
