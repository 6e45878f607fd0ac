#pragma once
// kvfuse::error: the one exception type host code throws. Messages name the bad value; code() says what kind of
// failure it is (core/status.hpp's Status: invalid_argument for a bad value, unsupported, store_unavailable,
// corrupt_entry, beyond_context, cancelled), so a caller can tell "the store is down" from a bug without parsing
// the message. Across an engine's forward pass kvfuse returns the same codes as statuses instead of throwing.

#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/core.h>

#include "kvfuse/core/status.hpp"

namespace kvfuse {

class error : public std::runtime_error {
 public:
  explicit error(const std::string& what, Status code = Status::invalid_argument)
      : std::runtime_error(what), code_(code) {}
  error(Status code, const std::string& what) : std::runtime_error(what), code_(code) {}

  [[nodiscard]] Status code() const noexcept { return code_; }

 private:
  Status code_;
};

// Throws kvfuse::error with a formatted message when `ok` is false: require(n > 0, "n = {} must be > 0", n).
template <class... Args>
void require(bool ok, fmt::format_string<Args...> message, Args&&... args) {
  if (!ok) throw error(fmt::format(message, std::forward<Args>(args)...));
}

// The same with a code other than invalid_argument: require_code(ok, Status::beyond_context, "...", ...).
template <class... Args>
void require_code(bool ok, Status code, fmt::format_string<Args...> message, Args&&... args) {
  if (!ok) throw error(code, fmt::format(message, std::forward<Args>(args)...));
}

namespace detail {

using kvfuse::require;
using kvfuse::require_code;

// True when `value` is finite and >= 0. For checks whose message needs indices, formatted only on failure:
// require(is_finite_nonneg(x), "mass[{}][{}] = {} must be finite and >= 0", i, j, x).
[[nodiscard]] inline bool is_finite_nonneg(double value) noexcept { return std::isfinite(value) && value >= 0; }

// Throws unless `value` is finite and >= 0; `what` names the value (e.g. "LoaderEstimate: fetch_chunk_s").
inline void require_finite_nonneg(double value, std::string_view what) {
  require(is_finite_nonneg(value), "{} = {} must be finite and >= 0", what, value);
}

// Throws unless `value` is finite and > 0; `what` names the value (e.g. "StorageDevice 'ssd': bandwidth_bytes_per_s").
inline void require_finite_positive(double value, std::string_view what) {
  require(std::isfinite(value) && value > 0, "{} = {} must be finite and > 0", what, value);
}

}  // namespace detail
}  // namespace kvfuse
