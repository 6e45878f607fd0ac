#pragma once
// The real model the real-model tests run on, and how they skip. The path follows scripts/fetch_model.sh:
// $KVFUSE_MODEL, else ${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}/SmolLM2-135M-Instruct.Q4_1.gguf.
//
// Real-model test cases are named "real model: ..." and CTest runs them as their own test
// (unit.<file>.real_model). A case that cannot run calls skip(): it says why, and the binary (tests/main.cpp)
// exits 77 when nothing failed but something was skipped, which CTest reports as Skipped, not Passed.
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

#include <doctest/doctest.h>

namespace kvfuse_test {

inline std::filesystem::path model_path() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  if (!env("KVFUSE_MODEL").empty()) return env("KVFUSE_MODEL");
  std::filesystem::path cache;
  if (!env("KVFUSE_CACHE_DIR").empty()) {
    cache = env("KVFUSE_CACHE_DIR");
  } else if (!env("XDG_CACHE_HOME").empty()) {
    cache = std::filesystem::path(env("XDG_CACHE_HOME")) / "kvfuse";
  } else {
    cache = std::filesystem::path(env("HOME")) / ".cache" / "kvfuse";
  }
  return cache / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

// Test cases that called skip() in this run of the binary.
inline int& skipped_cases() {
  static int count = 0;
  return count;
}

// Records that the current test case cannot run, and why; the caller returns right after.
inline void skip(const std::string& why) {
  MESSAGE("skipped: " << why);
  ++skipped_cases();
}

// The model file, or nullopt after skip() when it is absent or (with `optimized_only`) the build is not
// optimized: the real model takes minutes without optimization.
inline std::optional<std::filesystem::path> real_model(bool optimized_only) {
#ifdef NDEBUG
  constexpr bool optimized = true;
#else
  constexpr bool optimized = false;
#endif
  if (optimized_only && !optimized) {
    skip("Debug build (the real model takes minutes without optimization)");
    return std::nullopt;
  }
  const std::filesystem::path path = model_path();
  if (!std::filesystem::exists(path)) {
    skip("no model at " + path.string() + " (run scripts/fetch_model.sh or set KVFUSE_MODEL)");
    return std::nullopt;
  }
  return path;
}

}  // namespace kvfuse_test
