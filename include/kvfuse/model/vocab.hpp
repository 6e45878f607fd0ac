#pragma once
// TokenizerVocab: the tokenizer tables of a GGUF file (`tokenizer.ggml.*`, `tokenizer.chat_template`) as
// plain data, read by TokenizerVocab::from_gguf and checked by validate() before BPETokenizer indexes them.
//
// Only byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`) with a pre-tokenizer kvfuse knows
// (model/pretokenizer.hpp) pass validate(); SentencePiece ("llama"), WordPiece ("bert") and Unigram ("t5")
// vocabularies are refused with kvfuse::error naming the model.

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/gguf.hpp"
#include "kvfuse/model/pretokenizer.hpp"
#include "kvfuse/model/utf8.hpp"

namespace kvfuse {

// "No such token", as llama.cpp's LLAMA_TOKEN_NULL.
inline constexpr token_id kNoToken = -1;

// Token types as GGUF stores them in `tokenizer.ggml.token_type` (llama.cpp's llama_token_type).
enum class TokenType : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

// The tokenizer part of a GGUF file's metadata, as plain data.
struct TokenizerVocab {
  std::string model = "gpt2";             // tokenizer.ggml.model
  std::string pre;                        // tokenizer.ggml.pre
  std::vector<std::string> tokens;        // tokenizer.ggml.tokens: byte-encoded text of each id
  std::vector<std::int32_t> token_types;  // tokenizer.ggml.token_type (TokenType); empty: all normal
  std::vector<std::string> merges;        // tokenizer.ggml.merges: "left right", rank = index
  token_id bos = kNoToken;                // tokenizer.ggml.bos_token_id
  token_id eos = kNoToken;                // tokenizer.ggml.eos_token_id
  token_id unk = kNoToken;                // tokenizer.ggml.unknown_token_id
  token_id pad = kNoToken;                // tokenizer.ggml.padding_token_id
  bool add_bos = false;                   // tokenizer.ggml.add_bos_token
  bool add_eos = false;                   // tokenizer.ggml.add_eos_token
  std::string chat_template;              // tokenizer.chat_template (Jinja source)

  // Type of token `id` (normal when token_types is empty); throws for an id outside [0, tokens.size()).
  [[nodiscard]] TokenType type_of(token_id id) const {
    const std::size_t n = token_types.empty() ? tokens.size() : std::min(tokens.size(), token_types.size());
    detail::require(id >= 0 && static_cast<std::size_t>(id) < n, "tokenizer: token id {} is not in [0, {})", id, n);
    return token_types.empty() ? TokenType::normal : static_cast<TokenType>(token_types[static_cast<std::size_t>(id)]);
  }

  // Throws kvfuse::error naming the first bad field. Merges are checked by BPETokenizer, which indexes them.
  void validate() const;

  // Reads the keys listed above; the optional ones keep their defaults when absent.
  [[nodiscard]] static TokenizerVocab from_gguf(const GGUFFile& file);
};

inline void TokenizerVocab::validate() const {
  detail::require(model == "gpt2", "tokenizer: unsupported tokenizer model '{}' (supported: gpt2)", model);
  detail::require(!pre.empty(), "tokenizer: the vocabulary names no pre-tokenizer (tokenizer.ggml.pre); supported: {}",
                  detail::kSupportedPreTokenizers);
  detail::require(detail::pre_tokenizer_spec(pre).has_value(),
                  "tokenizer: unsupported pre-tokenizer '{}' (supported: {})", pre, detail::kSupportedPreTokenizers);
  detail::require(!tokens.empty(), "tokenizer: the vocabulary has no tokens");
  detail::require(tokens.size() <= static_cast<std::size_t>(INT32_MAX), "tokenizer: {} tokens do not fit token_id",
                  tokens.size());
  detail::require(token_types.empty() || token_types.size() == tokens.size(), "tokenizer: {} token types for {} tokens",
                  token_types.size(), tokens.size());
  for (std::size_t i = 0; i < token_types.size(); ++i) {
    detail::require(token_types[i] >= 0 && token_types[i] <= 6, "tokenizer: token {} has unknown token type {}", i,
                    token_types[i]);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    detail::require_utf8(tokens[i], fmt::format("token {}", i));
  }
  const auto n = static_cast<token_id>(tokens.size());
  const std::pair<const char*, token_id> ids[] = {{"bos", bos}, {"eos", eos}, {"unk", unk}, {"pad", pad}};
  for (const auto& [name, id] : ids) {
    detail::require(id == kNoToken || (id >= 0 && id < n), "tokenizer: {} token id {} is not in [0, {})", name, id, n);
  }
  detail::require(!add_bos || bos != kNoToken, "tokenizer: add_bos is set but there is no bos token");
  detail::require(!add_eos || eos != kNoToken, "tokenizer: add_eos is set but there is no eos token");
}

inline TokenizerVocab TokenizerVocab::from_gguf(const GGUFFile& file) {
  TokenizerVocab v;
  v.model = file.get_string("tokenizer.ggml.model");
  if (file.contains("tokenizer.ggml.pre")) v.pre = file.get_string("tokenizer.ggml.pre");
  v.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (file.contains("tokenizer.ggml.token_type")) {
    const auto types = file.get_i32_array("tokenizer.ggml.token_type");
    v.token_types.assign(types.begin(), types.end());
  }
  if (file.contains("tokenizer.ggml.merges")) v.merges = file.get_string_array("tokenizer.ggml.merges");
  auto id = [&](const char* key) {
    if (!file.contains(key)) return kNoToken;
    const std::int64_t value = file.get_i64(key);
    detail::require(value >= 0 && value <= INT32_MAX, "tokenizer: {} = {} is not a token id", key, value);
    return static_cast<token_id>(value);
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", false);
  v.add_eos = file.get_bool("tokenizer.ggml.add_eos_token", false);
  if (file.contains("tokenizer.chat_template")) v.chat_template = file.get_string("tokenizer.chat_template");
  return v;
}

}  // namespace kvfuse
