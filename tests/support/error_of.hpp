#pragma once
// The message of the kvfuse::error `f` throws, or "(no kvfuse::error)": for tests that check several
// substrings of one message.
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

}  // namespace kvfuse_test
