// kvfuse-rag-answer: a MuSiQue question answered by SmolLM2 on the CPU backend, twice —
//   full prefill of [system, passages..., question], and
//   chunk reuse: each passage's KV computed on its own at position 0 (a chunk cache), moved to its place
//   in the prompt by one RoPE shift, the system prompt and the question recomputed (naive reuse, the
//   lower bound every fusion policy improves on) —
// and prints the answers, the gold answers and the online time of each.
//
//   kvfuse-rag-answer --model GGUF --data musique_dev.json [--question 0] [--count 1] [--max-passages 10]
//                     [--max-new-tokens 24]

#include <charconv>
#include <chrono>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kvfuse/cpu.hpp"

namespace {

struct Options {
  std::string model, data;
  std::int64_t question = 0, count = 1, max_passages = 10, max_new_tokens = 24;
};

std::int64_t parse_int(std::string_view flag, std::string_view v) {
  std::int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  kvfuse::detail::require(ec == std::errc{} && p == v.data() + v.size() && x >= 0,
                          "{}: '{}' is not a non-negative integer", flag, v);
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    kvfuse::detail::require(i + 1 < argc, "{} needs a value", flag);
    const std::string_view v = argv[++i];
    if (flag == "--model") o.model = v;
    else if (flag == "--data") o.data = v;
    else if (flag == "--question") o.question = parse_int(flag, v);
    else if (flag == "--count") o.count = parse_int(flag, v);
    else if (flag == "--max-passages") o.max_passages = parse_int(flag, v);
    else if (flag == "--max-new-tokens") o.max_new_tokens = parse_int(flag, v);
    else throw kvfuse::error(fmt::format("unknown flag '{}'", flag));
  }
  kvfuse::detail::require(!o.model.empty() && !o.data.empty(), "--model GGUF and --data FILE are required");
  return o;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string answer_text(const kvfuse::BPETokenizer& tok, std::vector<kvfuse::token_id> ids) {
  while (!ids.empty() && tok.is_end_of_generation(ids.back())) ids.pop_back();
  return tok.decode(ids, false);
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(o.model);
  const kvfuse::BPETokenizer tok(kvfuse::TokenizerVocab::from_gguf(file));
  const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file);

  std::ifstream in(o.data);
  kvfuse::detail::require(in.good(), "--data: cannot open '{}'", o.data);
  const nlohmann::json data = nlohmann::json::parse(in);
  kvfuse::detail::require(data.is_array() && o.question + o.count <= static_cast<std::int64_t>(data.size()),
                          "--data: '{}' has {} questions, asked for {} from {}", o.data, data.size(), o.count,
                          o.question);

  for (std::int64_t q = o.question; q < o.question + o.count; ++q) {
    const nlohmann::json& item = data[static_cast<std::size_t>(q)];
    std::vector<std::string> passages;
    for (const auto& ctx : item.at("ctxs")) {
      if (static_cast<std::int64_t>(passages.size()) == o.max_passages) break;
      passages.push_back(ctx.at("text").get<std::string>());
    }
    const std::string question = item.at("question").get<std::string>();
    const kvfuse::RagPrompt prompt = kvfuse::build_rag_prompt(
        tok, "You are a helpful assistant. Answer the question using the documents, in a few words.", passages,
        question);
    const auto n = static_cast<std::int64_t>(prompt.tokens.size());

    // Full prefill.
    auto t0 = std::chrono::steady_clock::now();
    kvfuse::LlamaPrefill full = model.full_prefill(prompt.tokens);
    const double full_s = seconds_since(t0);
    const auto full_answer = model.greedy_decode(full.kv, full.logits, o.max_new_tokens, tok.eos());

    // Chunk caches, computed ahead of time (not part of the online time).
    std::vector<kvfuse::LlamaKVCache> caches;
    for (std::size_t p = 1; p + 1 < prompt.segments.size(); ++p) {
      const kvfuse::TokenRange r = prompt.segments[p];
      caches.push_back(model.prefill_chunk(std::span(prompt.tokens).subspan(static_cast<std::size_t>(r.begin),
                                                                            static_cast<std::size_t>(r.size())),
                                           0));
    }
    // Online: system prompt computed, passages brought in and shifted, question recomputed.
    t0 = std::chrono::steady_clock::now();
    const kvfuse::TokenRange sys = prompt.segments.front();
    kvfuse::LlamaKVCache merged = model.prefill_chunk(
        std::span(prompt.tokens).first(static_cast<std::size_t>(sys.end)), 0);
    for (std::size_t p = 0; p < caches.size(); ++p) {
      kvfuse::LlamaKVCache shifted = caches[p];
      model.rope_shift(shifted, {0, shifted.num_rows()}, prompt.segments[p + 1].begin);
      merged.append(shifted);
    }
    const kvfuse::TokenRange query = prompt.segments.back();
    merged.append(model.prefill_chunk(std::span(prompt.tokens).subspan(static_cast<std::size_t>(query.begin)),
                                      query.begin));
    kvfuse::TokenSet selected;
    kvfuse::append_range(selected, query);
    const kvfuse::PartialPrefillResult reuse = model.partial_prefill(prompt.tokens, merged, selected, {});
    const double reuse_s = seconds_since(t0);
    const auto reuse_answer = model.greedy_decode(merged, reuse.logits, o.max_new_tokens, tok.eos());

    fmt::print("Q{}: {}\n  gold: {}\n", q, question, fmt::join(item.at("answers").get<std::vector<std::string>>(), " | "));
    fmt::print("  prompt: {} tokens ({} passages)\n", n, passages.size());
    fmt::print("  full prefill   {:7.2f} s ({:5.0f} tokens/s): {}\n", full_s, static_cast<double>(n) / full_s,
               answer_text(tok, full_answer));
    fmt::print("  naive reuse    {:7.2f} s ({:4.1f}x faster):     {}\n", reuse_s, full_s / reuse_s,
               answer_text(tok, reuse_answer));
  }
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "kvfuse-rag-answer: {}\n", e.what());
  return 2;
}
