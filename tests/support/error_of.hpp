#pragma once
// The message of the kvfuse::error `f` throws, or "(no kvfuse::error)": for tests that check several
// substrings of one message. code_of: the code of that error, or nullopt when none is thrown.
#include <optional>
#include <string>

#include "kvfuse/core/error.hpp"

namespace kvfuse_test {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const kvfuse::error& e) {
    return e.what();
  }
  return "(no kvfuse::error)";
}

template <class F>
std::optional<kvfuse::Status> code_of(F&& f) {
  try {
    f();
  } catch (const kvfuse::error& e) {
    return e.code();
  }
  return std::nullopt;
}

}  // namespace kvfuse_test
