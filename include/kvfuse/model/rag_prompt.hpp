#pragma once
// build_rag_prompt: a RAG prompt (system prompt, passages, question) in the model's ChatML template whose
// passages are separately tokenized chunks, with the token range of each — what a chunk KV cache (CacheBlend,
// Epic, Cache-Craft) stores and reuses.
//
// Layout: "Document: {passage}\n" per passage and "Question: {question}" (below).

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/bpe.hpp"
#include "kvfuse/model/chat_template.hpp"
#include "kvfuse/model/regex.hpp"
#include "kvfuse/model/utf8.hpp"
#include "kvfuse/model/vocab.hpp"

namespace kvfuse {

// A tokenized RAG prompt and the token range of each of its segments, in order:
// segments[0] the system turn, segments[1..n] the passages, segments[n+1] the question and generation prompt.
struct RagPrompt {
  std::vector<token_id> tokens;
  std::vector<TokenRange> segments;

  // System prompt and passages as the reusable chunks (all marked cached), the last segment as the query.
  [[nodiscard]] PromptLayout layout() const {
    PromptLayout l;
    for (std::size_t i = 0; i + 1 < segments.size(); ++i) l.chunks.push_back({segments[i], true});
    l.query = segments.empty() ? TokenRange{} : segments.back();
    return l;
  }
};

// Builds the CacheBlend-style RAG prompt (system prompt, then the passages, then the question) in the
// tokenizer's ChatML template, as one system and one user turn plus the generation prompt:
//
//   [bos if add_bos] <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n      segment 0
//   Document: {passage 1, trimmed}\n                                                  segment 1
//   ...
//   Document: {passage n, trimmed}\n                                                  segment n
//   Question: {question}<|im_end|>\n<|im_start|>assistant\n                           segment n+1
//
// i.e. format_chat({{"system", system}, {"user", "Document: p1\n...Document: pn\nQuestion: q"}}, true).
// Each segment is tokenized on its own, so a passage's tokens do not depend on its neighbours or its index
// and its chunk KV can be stored once and reused in any order. The ChatML markers come in as token ids and
// the caller's text is tokenized with parse_special = false, so a passage cannot inject control tokens.
//
// Equal to tokenizing the whole string (when the text contains no control-token text): the first two
// boundaries sit at a control token or right after one; every other boundary is "\n" | "Document" or
// "\n" | "Question", where a single "\n" after a non-space ends every pre-token (it is its own pre-token
// under the GPT-2, smollm and llama3 regexes whether or not text follows) and BPE never merges across
// pre-tokens. Passages are trimmed of Unicode whitespace (\s) so that "\n" is never part of a longer
// whitespace run, and a passage that is empty after trimming is refused. The tests check the equality on
// MuSiQue passages against token ids from Hugging Face tokenizers.
[[nodiscard]] inline RagPrompt build_rag_prompt(const BPETokenizer& tok, std::string_view system,
                                                std::span<const std::string> passages, std::string_view question) {
  const ChatTemplate chat(tok.chat_template());  // refuses non-ChatML templates
  const token_id im_start = tok.find_token("<|im_start|>");
  const token_id im_end = tok.find_token("<|im_end|>");
  detail::require(
      im_start != kNoToken && tok.token_type(im_start) == TokenType::control && im_end != kNoToken &&
          tok.token_type(im_end) == TokenType::control,
      "tokenizer: ChatML template but '<|im_start|>' / '<|im_end|>' are not control tokens of the vocabulary");
  const detail::Pcre2Regex trim(R"((?s)\A\s*+(.*?)\s*+\z)");  // group 1: the text without surrounding \s

  RagPrompt p;
  auto append_text = [&](std::string_view text) {
    const auto ids = tok.encode(text, /*parse_special=*/false);
    p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  };
  auto close_segment = [&] {
    const std::int64_t begin = p.segments.empty() ? 0 : p.segments.back().end;
    p.segments.push_back({begin, static_cast<std::int64_t>(p.tokens.size())});
  };

  if (tok.add_bos()) p.tokens.push_back(tok.bos());
  p.tokens.push_back(im_start);
  append_text(fmt::format("system\n{}", system));
  p.tokens.push_back(im_end);
  append_text("\n");
  p.tokens.push_back(im_start);
  append_text("user\n");
  close_segment();

  for (std::size_t i = 0; i < passages.size(); ++i) {
    const std::string& text = passages[i];
    detail::require_utf8(text, fmt::format("passage {}", i));
    const auto [b, e] = *trim.find_group(text, 1);  // the pattern matches every string
    const std::string_view body = std::string_view(text).substr(b, e - b);
    detail::require(!body.empty(), "tokenizer: passage {} is empty or only whitespace", i);
    append_text(fmt::format("Document: {}\n", body));
    close_segment();
  }

  append_text(fmt::format("Question: {}", question));
  p.tokens.push_back(im_end);
  append_text("\n");
  p.tokens.push_back(im_start);
  append_text("assistant\n");
  close_segment();
  return p;
}

}  // namespace kvfuse
