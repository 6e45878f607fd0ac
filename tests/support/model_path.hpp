#pragma once
// Where the real-model tests find the model, the same rule as scripts/fetch_model.sh: $KVFUSE_MODEL, else
// ${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}/SmolLM2-135M-Instruct.Q4_1.gguf. The file may
// not exist; tests skip with a message then.
#include <cstdlib>
#include <filesystem>
#include <string>

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

}  // namespace kvfuse_test
