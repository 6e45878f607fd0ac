#pragma once
// What the real-model examples share: command-line number and list parsing, the default model path (as
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
  kvfuse::detail::require(ec == std::errc{} && p == v.data() + v.size() && x >= 0,
                          "{}: '{}' is not a non-negative integer", flag, v);
  return x;
}

inline double parse_real(std::string_view flag, std::string_view v) {
  double x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  kvfuse::detail::require(ec == std::errc{} && p == v.data() + v.size(), "{}: '{}' is not a number", flag, v);
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

inline std::string default_model() {
  if (const char* m = std::getenv("KVFUSE_MODEL"); m != nullptr && *m != '\0') return m;
  std::filesystem::path cache;
  if (const char* c = std::getenv("KVFUSE_CACHE_DIR"); c != nullptr && *c != '\0') {
    cache = c;
  } else if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') {
    cache = std::filesystem::path(x) / "kvfuse";
  } else {
    const char* home = std::getenv("HOME");
    cache = std::filesystem::path(home != nullptr ? home : ".") / ".cache" / "kvfuse";
  }
  return (cache / "SmolLM2-135M-Instruct.Q4_1.gguf").string();
}

struct Question {
  std::vector<std::string> passages;
  std::string question;
  std::vector<std::string> answers;
};

// Questions [start, start + limit) of a MuSiQue JSON file, with at most `max_passages` passages each.
inline std::vector<Question> load_questions(const std::string& path, std::int64_t start, std::int64_t limit,
                                            std::int64_t max_passages) {
  std::ifstream in(path);
  kvfuse::detail::require(in.good(), "--data: cannot open '{}'", path);
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw kvfuse::error(fmt::format("--data: '{}' is not valid JSON: {}", path, e.what()));
  }
  kvfuse::detail::require(data.is_array(), "--data: '{}' must hold a JSON array of questions", path);
  kvfuse::detail::require(start + limit <= static_cast<std::int64_t>(data.size()),
                          "--data: '{}' has {} questions; --start {} --limit {} asks for more", path, data.size(),
                          start, limit);
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
    kvfuse::detail::require(!x.passages.empty() && !x.answers.empty(), "--data: question {} has {} passages and {} "
                            "answers; needs at least one of each", q, x.passages.size(), x.answers.size());
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace kvfuse_example
