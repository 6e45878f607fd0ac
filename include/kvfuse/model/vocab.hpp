#pragma once
// TokenizerVocab: the tokenizer tables of a GGUF file (`tokenizer.ggml.*`, `tokenizer.chat_template`) as
// plain data, read by TokenizerVocab::from_gguf and checked by validate() before Tokenizer indexes them.
//
// Two tokenizer models pass validate(), as llama.cpp names them in `tokenizer.ggml.model`:
//   "gpt2"   byte-level BPE (merges, and a pre-tokenizer kvfuse knows: model/pretokenizer.hpp), e.g. SmolLM2;
//   "llama"  SentencePiece BPE (token scores, "<0xHH>" byte tokens), e.g. Llama 2, Gemma 3.
// WordPiece ("bert"), Unigram ("t5"), RWKV and every other model are refused with kvfuse::error naming it.

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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
  std::string model = "gpt2";             // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;                        // tokenizer.ggml.pre (gpt2 only; SentencePiece has no pre-tokenizer)
  std::vector<std::string> tokens;        // tokenizer.ggml.tokens: text of each id (gpt2: byte-encoded, "Ġthe";
                                          // llama: spaces as U+2581, "▁the")
  std::vector<std::int32_t> token_types;  // tokenizer.ggml.token_type (TokenType); empty: all normal
  std::vector<std::string> merges;        // tokenizer.ggml.merges (gpt2): "left right", rank = index
  std::vector<float> scores;              // tokenizer.ggml.scores (llama): merge priority; empty: all 0
  token_id bos = kNoToken;                // tokenizer.ggml.bos_token_id
  token_id eos = kNoToken;                // tokenizer.ggml.eos_token_id
  token_id unk = kNoToken;                // tokenizer.ggml.unknown_token_id
  token_id pad = kNoToken;                // tokenizer.ggml.padding_token_id
  bool add_bos = false;                   // tokenizer.ggml.add_bos_token
  bool add_eos = false;                   // tokenizer.ggml.add_eos_token
  bool add_space_prefix = false;          // tokenizer.ggml.add_space_prefix: " " before text that starts a
                                          // prompt or follows a special token (llama), stripped by decode
  std::string chat_template;              // tokenizer.chat_template (Jinja source)

  // Type of token `id` (normal when token_types is empty); throws for an id outside [0, tokens.size()).
  [[nodiscard]] TokenType type_of(token_id id) const {
    const std::size_t n = token_types.empty() ? tokens.size() : std::min(tokens.size(), token_types.size());
    detail::require(id >= 0 && static_cast<std::size_t>(id) < n, "tokenizer: token id {} is not in [0, {})", id, n);
    return token_types.empty() ? TokenType::normal : static_cast<TokenType>(token_types[static_cast<std::size_t>(id)]);
  }

  // Throws kvfuse::error naming the first bad field. Merges are checked by the BPE model, which indexes them.
  void validate() const;

  // Reads the keys listed above; the optional ones keep their defaults when absent, except that a "llama"
  // vocabulary without add_bos_token / add_space_prefix gets true for both, as llama.cpp defaults them.
  [[nodiscard]] static TokenizerVocab from_gguf(const GGUFFile& file);
};

inline void TokenizerVocab::validate() const {
  detail::require(model == "gpt2" || model == "llama",
                  "tokenizer: unsupported tokenizer model '{}' (supported: gpt2 = byte-level BPE, llama = "
                  "SentencePiece BPE)",
                  model);
  if (model == "gpt2") {
    detail::require(!pre.empty(),
                    "tokenizer: the vocabulary names no pre-tokenizer (tokenizer.ggml.pre); supported: {}",
                    detail::kSupportedPreTokenizers);
    detail::require(detail::pre_tokenizer_spec(pre).has_value(),
                    "tokenizer: unsupported pre-tokenizer '{}' (supported: {})", pre, detail::kSupportedPreTokenizers);
  }
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
  detail::require(scores.empty() || scores.size() == tokens.size(), "tokenizer: {} scores for {} tokens",
                  scores.size(), tokens.size());
  for (std::size_t i = 0; i < scores.size(); ++i) {
    detail::require(!std::isnan(scores[i]), "tokenizer: token {} has score NaN", i);
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
  if (file.contains("tokenizer.ggml.scores")) {
    // float32 as written by llama.cpp's converters; int32 is accepted too, as llama.cpp does.
    const GGUFArray& scores = file.get_array("tokenizer.ggml.scores");
    if (scores.element_type() == GGUFValueType::int32) {
      for (const std::int32_t s : file.get_i32_array("tokenizer.ggml.scores")) {
        v.scores.push_back(static_cast<float>(s));
      }
    } else {
      const auto f = file.get_f32_array("tokenizer.ggml.scores");  // names the key and type when neither
      v.scores.assign(f.begin(), f.end());
    }
  }
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
  const bool spm = v.model == "llama";
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", spm);
  v.add_eos = file.get_bool("tokenizer.ggml.add_eos_token", false);
  v.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix", spm);
  if (file.contains("tokenizer.chat_template")) v.chat_template = file.get_string("tokenizer.chat_template");
  return v;
}

}  // namespace kvfuse
