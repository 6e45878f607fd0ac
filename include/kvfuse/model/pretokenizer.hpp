#pragma once
// The pre-tokenizers the byte-level BPE model (model/bpe.hpp) supports (kvfuse::detail): the regexes that
// split text into pieces before BPE, by the name a GGUF file gives in `tokenizer.ggml.pre`.
//
// Regexes copied from llama.cpp's llm_tokenizer_bpe constructor (src/llama-vocab.cpp), in PCRE2 syntax:
//   "smollm", "starcoder", "refact"   \p{N}   then the GPT-2 regex          (LLAMA_VOCAB_PRE_TYPE_SMOLLM ...)
//   "gpt-2"                           the GPT-2 regex                      (LLAMA_VOCAB_PRE_TYPE_GPT2)
//   "llama3", "llama-v3", "llama-bpe" the Llama 3 regex, and a piece that is a whole vocabulary token is
//                                     emitted without merging (llama.cpp's ignore_merges)
//   "qwen2", "deepseek-r1-qwen",      the Qwen2 regex: the Llama 3 regex with single digits (\p{N} for
//   "kormo", "f2llmv2"                \p{N}{1,3}), merges applied (LLAMA_VOCAB_PRE_TYPE_QWEN2)
//   "default"                         llama.cpp's four-regex default list (LLAMA_VOCAB_PRE_TYPE_DEFAULT)
//   GPT-2 regex: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// The regexes of one pre-tokenizer are applied one after another with llama.cpp's "isolated" semantics
// (matches and the gaps between them both become pieces; detail::Pcre2Regex::split).
// Any other pre-tokenizer, and a missing `tokenizer.ggml.pre`, is refused with kvfuse::error naming it
// (llama.cpp falls back to "default" with a warning; kvfuse does not guess).

#include <optional>
#include <string_view>
#include <vector>

namespace kvfuse::detail {

// The regexes and options of one llama.cpp pre-tokenizer type.
struct PreTokenizerSpec {
  std::vector<std::string_view> regexes;
  bool ignore_merges = false;  // a piece that is itself a token is emitted whole (llama.cpp, llama3 family)
};

// GPT-2's pattern, the one llama.cpp's unicode_regex_split_custom_gpt2 implements by hand.
inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// llama.cpp's LLAMA_VOCAB_PRE_TYPE_LLAMA3 regex: tokenizer.json's (?i:'s|...) spelled case by case.
inline constexpr std::string_view kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 regex: Qwen2's tokenizer.json pattern, (?i:...) spelled out as above.
inline constexpr std::string_view kQwen2Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline constexpr std::string_view kSupportedPreTokenizers =
    "default, gpt-2, smollm, starcoder, refact, llama3, llama-v3, llama-bpe, qwen2, deepseek-r1-qwen, kormo, "
    "f2llmv2";

// The spec of pre-tokenizer `name`, or nullopt when kvfuse does not support it.
[[nodiscard]] inline std::optional<PreTokenizerSpec> pre_tokenizer_spec(std::string_view name) {
  if (name == "smollm" || name == "starcoder" || name == "refact")
    return PreTokenizerSpec{{R"(\p{N})", kGpt2Regex}, false};
  if (name == "gpt-2") return PreTokenizerSpec{{kGpt2Regex}, false};
  if (name == "llama3" || name == "llama-v3" || name == "llama-bpe") return PreTokenizerSpec{{kLlama3Regex}, true};
  if (name == "qwen2" || name == "deepseek-r1-qwen" || name == "kormo" || name == "f2llmv2")
    return PreTokenizerSpec{{kQwen2Regex}, false};
  if (name == "default") {
    return PreTokenizerSpec{{R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"}, false};
  }
  return std::nullopt;
}

}  // namespace kvfuse::detail
