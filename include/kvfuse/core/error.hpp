#pragma once
// kvfuse::error: the one exception type host code throws. Messages name the bad value.

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace kvfuse {

class error : public std::runtime_error {
 public:
  explicit error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {

// Throws kvfuse::error with a formatted message when `ok` is false.
template <class... Args>
void require(bool ok, fmt::format_string<Args...> message, Args&&... args) {
  if (!ok) throw error(fmt::format(message, std::forward<Args>(args)...));
}

}  // namespace detail
}  // namespace kvfuse
