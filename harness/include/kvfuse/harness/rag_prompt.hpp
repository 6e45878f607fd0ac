#pragma once
// build_rag_prompt: a RAG prompt (system prompt, passages, question) whose passages are separately
// tokenized chunks, with the token range of each — what a chunk KV cache (CacheBlend, Epic, Cache-Craft)
// stores and reuses. In the model's ChatML chat template, or as plain text for a base model without a chat
// template (Gemma 3 270M).
//
// Layout: "Document: {passage}\n" per passage and "Question: {question}" (below), in both forms.

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
#include "kvfuse/model/chat_template.hpp"
#include "kvfuse/model/regex.hpp"
#include "kvfuse/model/text_tokenizer.hpp"
#include "kvfuse/model/utf8.hpp"
#include "kvfuse/model/vocab.hpp"

namespace kvfuse {

// A tokenized RAG prompt and the token range of each of its segments, in order:
// segments[0] the system turn, segments[1..n] the passages, segments[n+1] the question and generation prompt.
struct RagPrompt {
  std::vector<token_id> tokens;
  std::vector<TokenRange> segments;

  // The passages as reusable chunks (marked cached), the last segment as the query. The system turn is a cached
  // chunk too, or, with system_context, the chunk context (PromptLayout::chunk_context): always computed, and
  // the passages' caches are computed behind it, as kvfuse-server stores them.
  [[nodiscard]] PromptLayout layout(bool system_context = false) const {
    PromptLayout l;
    for (std::size_t i = 0; i + 1 < segments.size(); ++i)
      l.chunks.push_back({segments[i], !(system_context && i == 0)});
    l.query = segments.empty() ? TokenRange{} : segments.back();
    if (system_context && segments.size() > 1) l.chunk_context = segments.front().end;
    return l;
  }
};

// Builds the CacheBlend-style RAG prompt: system prompt, then the passages, then the question.
//
// With a chat template (it must be ChatML), one system and one user turn plus the generation prompt:
//
//   [bos if add_bos] <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n      segment 0
//   Document: {passage 1, trimmed}\n                                                  segment 1
//   ...
//   Document: {passage n, trimmed}\n                                                  segment n
//   Question: {question}<|im_end|>\n<|im_start|>assistant\n                           segment n+1
//
// i.e. format_chat({{"system", system}, {"user", "Document: p1\n...Document: pn\nQuestion: q"}}, true).
//
// Without a chat template (a base model), the same segments as plain text:
//
//   [bos if add_bos] {system, trimmed}\n          segment 0 (only [bos] when the system prompt is empty)
//   Document: {passage 1, trimmed}\n              segment 1
//   ...
//   Document: {passage n, trimmed}\n              segment n
//   Question: {question}\nAnswer:                 segment n+1
//
// Each segment is tokenized on its own, so a passage's tokens do not depend on its neighbours or its index
// and its chunk KV can be stored once and reused in any order. Control tokens come in as token ids and the
// caller's text is tokenized with parse_special = false, so a passage cannot inject control tokens.
//
// Equal to tokenizing the whole string at once (when the text contains no control-token text):
//   - ChatML, byte-level BPE: the first two boundaries sit at a control token or right after one; every
//     other boundary is "\n" | "Document" or "\n" | "Question", where a single "\n" after a non-space ends
//     every pre-token (it is its own pre-token under the GPT-2, smollm and llama3 regexes whether or not
//     text follows) and BPE never merges across pre-tokens. The plain layout's boundaries are of the second
//     kind only.
//   - Plain, SentencePiece without a space prefix whose "\n" is a user-defined token (Gemma 3): every
//     boundary follows a "\n", which is cut out before SentencePiece runs, so no merge crosses it. (With a
//     space prefix, each segment's text would get its own leading space; such vocabularies still get a
//     valid prompt of separately tokenized segments, just not the whole string's ids.)
// Passages and the plain system prompt are trimmed of Unicode whitespace (\s) so that "\n" is never part
// of a longer whitespace run, and a passage that is empty after trimming is refused. The tests check the
// equality on MuSiQue passages against Hugging Face tokenizers (SmolLM2, ChatML) and llama.cpp (Gemma 3,
// plain).
[[nodiscard]] inline RagPrompt build_rag_prompt(const Tokenizer& tok, std::string_view system,
                                                std::span<const std::string> passages, std::string_view question) {
  const bool chat = !tok.chat_template().empty();
  const token_id im_start = chat ? tok.find_token("<|im_start|>") : kNoToken;
  const token_id im_end = chat ? tok.find_token("<|im_end|>") : kNoToken;
  if (chat) {
    (void)ChatTemplate(tok.chat_template());  // refuses non-ChatML templates
    detail::require(
        im_start != kNoToken && tok.token_type(im_start) == TokenType::control && im_end != kNoToken &&
            tok.token_type(im_end) == TokenType::control,
        "tokenizer: ChatML template but '<|im_start|>' / '<|im_end|>' are not control tokens of the vocabulary");
  }
  const detail::Pcre2Regex trim(R"((?s)\A\s*+(.*?)\s*+\z)");  // group 1: the text without surrounding \s
  auto trimmed = [&](std::string_view text) {
    const auto [b, e] = *trim.find_group(text, 1);  // the pattern matches every string
    return text.substr(b, e - b);
  };

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
  if (chat) {
    p.tokens.push_back(im_start);
    append_text(fmt::format("system\n{}", system));
    p.tokens.push_back(im_end);
    append_text("\n");
    p.tokens.push_back(im_start);
    append_text("user\n");
  } else {
    detail::require_utf8(system, "system prompt");
    const std::string_view body = trimmed(system);
    if (!body.empty()) append_text(fmt::format("{}\n", body));
  }
  close_segment();

  for (std::size_t i = 0; i < passages.size(); ++i) {
    const std::string& text = passages[i];
    detail::require_utf8(text, fmt::format("passage {}", i));
    const std::string_view body = trimmed(text);
    detail::require(!body.empty(), "tokenizer: passage {} is empty or only whitespace", i);
    append_text(fmt::format("Document: {}\n", body));
    close_segment();
  }

  if (chat) {
    append_text(fmt::format("Question: {}", question));
    p.tokens.push_back(im_end);
    append_text("\n");
    p.tokens.push_back(im_start);
    append_text("assistant\n");
  } else {
    append_text(fmt::format("Question: {}\nAnswer:", question));
  }
  close_segment();
  return p;
}

}  // namespace kvfuse
