#pragma once
// The real models the real-model tests run on, and how they skip. The paths follow scripts/fetch_model.sh:
// SmolLM2: $KVFUSE_MODEL, else <cache>/SmolLM2-135M-Instruct.Q4_1.gguf; Gemma 3: $KVFUSE_GEMMA3_MODEL, else
// <cache>/gemma-3-270m-q4_k_m.gguf; Qwen2.5-Coder-0.5B-Instruct: $KVFUSE_QWEN2_MODEL, else
// <cache>/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf;
// <cache> = ${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}.
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

enum class RealModel { smollm2, gemma3, qwen2 };

// The override variable, cached file name and fetch_model.sh argument of each model.
struct RealModelFiles {
  const char* override_var;
  const char* file_name;
  const char* fetch_name;
};

inline RealModelFiles real_model_files(RealModel which) {
  switch (which) {
    case RealModel::gemma3:
      return {"KVFUSE_GEMMA3_MODEL", "gemma-3-270m-q4_k_m.gguf", "gemma3"};
    case RealModel::qwen2:
      return {"KVFUSE_QWEN2_MODEL", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2"};
    case RealModel::smollm2:
      break;
  }
  return {"KVFUSE_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2"};
}

inline std::filesystem::path model_path(RealModel which = RealModel::smollm2) {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  const char* override_var = real_model_files(which).override_var;
  if (!env(override_var).empty()) return env(override_var);
  std::filesystem::path cache;
  if (!env("KVFUSE_CACHE_DIR").empty()) {
    cache = env("KVFUSE_CACHE_DIR");
  } else if (!env("XDG_CACHE_HOME").empty()) {
    cache = std::filesystem::path(env("XDG_CACHE_HOME")) / "kvfuse";
  } else {
    cache = std::filesystem::path(env("HOME")) / ".cache" / "kvfuse";
  }
  return cache / real_model_files(which).file_name;
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
inline std::optional<std::filesystem::path> real_model(bool optimized_only, RealModel which = RealModel::smollm2) {
#ifdef NDEBUG
  constexpr bool optimized = true;
#else
  constexpr bool optimized = false;
#endif
  if (optimized_only && !optimized) {
    skip("Debug build (the real model takes minutes without optimization)");
    return std::nullopt;
  }
  const std::filesystem::path path = model_path(which);
  if (!std::filesystem::exists(path)) {
    const RealModelFiles files = real_model_files(which);
    skip("no model at " + path.string() + " (run scripts/fetch_model.sh " + files.fetch_name + " or set " +
         files.override_var + ")");
    return std::nullopt;
  }
  return path;
}

}  // namespace kvfuse_test
