#pragma once
// What the real-model examples share: command-line number and list parsing, the model paths (as
// scripts/fetch_model.sh), and MuSiQue questions (ctxs[].text, question, answers[]).
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/core/error.hpp"

namespace kvfuse_example {

inline std::int64_t parse_int(std::string_view flag, std::string_view v) {
  std::int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  kvfuse::require(ec == std::errc{} && p == v.data() + v.size() && x >= 0,
                          "{}: '{}' is not a non-negative integer", flag, v);
  return x;
}

inline double parse_real(std::string_view flag, std::string_view v) {
  double x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  kvfuse::require(ec == std::errc{} && p == v.data() + v.size(), "{}: '{}' is not a number", flag, v);
  return x;
}

inline std::vector<std::string> split(std::string_view s) {
  std::vector<std::string> out;
  while (!s.empty()) {
    const std::size_t c = s.find(',');
    out.emplace_back(s.substr(0, c));
    s = c == std::string_view::npos ? std::string_view{} : s.substr(c + 1);
  }
  return out;
}

// ${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfuse}, where scripts/fetch_model.sh keeps the models.
inline std::filesystem::path cache_dir() {
  const auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v != nullptr ? std::string(v) : std::string();
  };
  if (!env("KVFUSE_CACHE_DIR").empty()) return env("KVFUSE_CACHE_DIR");
  if (!env("XDG_CACHE_HOME").empty()) return std::filesystem::path(env("XDG_CACHE_HOME")) / "kvfuse";
  const std::string home = env("HOME");
  return std::filesystem::path(home.empty() ? "." : home) / ".cache" / "kvfuse";
}

// A model by name as scripts/fetch_model.sh fetches it ("smollm2": $KVFUSE_MODEL or the cached SmolLM2 file;
// "gemma3": $KVFUSE_GEMMA3_MODEL or the cached Gemma 3 270M file; "qwen2": $KVFUSE_QWEN2_MODEL or the cached
// Qwen2.5-Coder-0.5B-Instruct file); any other argument is a path.
inline std::string resolve_model(std::string_view name_or_path = "smollm2") {
  struct Known {
    std::string_view name;
    const char* override_var;
    const char* file_name;
  };
  static constexpr Known known[] = {{"smollm2", "KVFUSE_MODEL", "SmolLM2-135M-Instruct.Q4_1.gguf"},
                                    {"gemma3", "KVFUSE_GEMMA3_MODEL", "gemma-3-270m-q4_k_m.gguf"},
                                    {"qwen2", "KVFUSE_QWEN2_MODEL", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}};
  for (const Known& k : known) {
    if (name_or_path != k.name) continue;
    if (const char* m = std::getenv(k.override_var); m != nullptr && *m != '\0') return m;
    return (cache_dir() / k.file_name).string();
  }
  return std::string(name_or_path);
}

struct Question {
  std::vector<std::string> passages;
  std::string question;
  std::vector<std::string> answers;
};

// A MuSiQue JSON file: an array of questions.
inline nlohmann::json read_dataset(const std::string& path) {
  std::ifstream in(path);
  kvfuse::require(in.good(), "--data: cannot open '{}'", path);
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw kvfuse::error(fmt::format("--data: '{}' is not valid JSON: {}", path, e.what()));
  }
  kvfuse::require(data.is_array(), "--data: '{}' must hold a JSON array of questions", path);
  return data;
}

inline std::int64_t question_count(const std::string& path) {
  return static_cast<std::int64_t>(read_dataset(path).size());
}

// Questions [start, start + limit) of a MuSiQue JSON file, with at most `max_passages` passages each.
inline std::vector<Question> load_questions(const std::string& path, std::int64_t start, std::int64_t limit,
                                            std::int64_t max_passages) {
  const nlohmann::json data = read_dataset(path);
  const auto size = static_cast<std::int64_t>(data.size());
  kvfuse::require(start >= 0 && limit >= 0 && start <= size && limit <= size - start,
                          "--data: '{}' has {} questions; --start {} --limit {} asks for more", path, size, start,
                          limit);
  std::vector<Question> out;
  for (std::int64_t q = start; q < start + limit; ++q) {
    const nlohmann::json& item = data[static_cast<std::size_t>(q)];
    Question x;
    try {
      for (const auto& ctx : item.at("ctxs")) {
        if (static_cast<std::int64_t>(x.passages.size()) == max_passages) break;
        x.passages.push_back(ctx.at("text").get<std::string>());
      }
      x.question = item.at("question").get<std::string>();
      x.answers = item.at("answers").get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      throw kvfuse::error(fmt::format("--data: question {} of '{}' does not follow the MuSiQue schema "
                                      "(ctxs[].text, question, answers[]): {}",
                                      q, path, e.what()));
    }
    kvfuse::require(!x.passages.empty() && !x.answers.empty(), "--data: question {} has {} passages and {} "
                            "answers; needs at least one of each", q, x.passages.size(), x.answers.size());
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace kvfuse_example
