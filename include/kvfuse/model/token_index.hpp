#pragma once
// TokenIndex (kvfuse::detail): what both tokenizer models read from a validated TokenizerVocab — the id of
// each token text, the bytes each token stands for, which tokens end generation, and the special tokens
// cut out of the text before a model sees it (llama.cpp's tokenizer_st_partition).
//
// The bytes of a token (llama.cpp's token_to_piece with special = true):
//   normal        gpt2: the token text mapped back through GPT-2's byte map ("Ġthe" -> " the"; a text
//                 outside that alphabet stands for itself, as Hugging Face's GGUF converter reads it);
//                 llama: the token text with U+2581 turned back into spaces ("▁the" -> " the")
//   byte          "<0xAB>" -> the byte 0xAB
//   control, unknown, user-defined   the token text ("<|im_end|>", "<end_of_turn>", "\n\n")
//   undefined, unused                nothing, as in llama.cpp
// Token types are the file's, with llama.cpp's override of control-looking texts applied first
// (override_control_token_types, below).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/byte_map.hpp"
#include "kvfuse/model/vocab.hpp"

namespace kvfuse::detail {

// SentencePiece's whitespace symbol U+2581 ("▁"), which "llama" vocabularies write for a space.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

// Hash for unordered_map<std::string, ...> lookups by string_view without a copy.
struct TextHash {
  using is_transparent = void;
  [[nodiscard]] std::size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// `text` with every occurrence of `from` replaced by `to`.
[[nodiscard]] inline std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  for (std::size_t hit = text.find(from); hit != std::string_view::npos; hit = text.find(from, pos)) {
    out.append(text.substr(pos, hit - pos)).append(to);
    pos = hit + from.size();
  }
  return out.append(text.substr(pos));
}

// Token texts llama.cpp's vocabulary loader (llama_vocab::impl::load) makes end-of-generation tokens: its
// end-of-generation list, and the fill-in-the-middle pad / repository / file-separator tokens it adds to it.
inline constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
    "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
    "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",  // DeepSeek: <｜end▁of▁sentence｜>
    "[e~[",
    // fill-in-the-middle pad, repository, file separator
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
    "<REPO>", "<reponame>", "<|file_sep|>"};

// Further texts llama.cpp's loader makes control tokens: the fill-in-the-middle prefix / suffix / middle.
inline constexpr std::string_view kFillInTheMiddleTexts[] = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>", "<PRE>",
    "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>", "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
    "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "hole\xEF\xBD\x9C>", "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>",
    "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>", "<MID>",
    "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"};

[[nodiscard]] inline bool is_end_of_generation_text(std::string_view text) noexcept {
  return std::find(std::begin(kEndOfGenerationTexts), std::end(kEndOfGenerationTexts), text) !=
         std::end(kEndOfGenerationTexts);
}

// llama.cpp's load-time override of token types by text: a token with one of the texts above is a control
// token whatever type the file gives it ("control-looking token ... its type will be overridden"). Gemma 3's
// user-defined "</s>" is one: it is then cut out of the text only with parse_special, and decoded only with
// render_special. llama.cpp's exceptions for gpt-oss and Solar Open ("<|end|>") and for Gemma 4 and PLaMo
// ("</s>") concern vocabularies whose pre-tokenizers or tokenizer models kvfuse refuses; they are not
// reproduced. Where llama.cpp takes only the first fill-in-the-middle token of a kind it finds (in hash
// order), kvfuse takes all of them.
inline void override_control_token_types(TokenizerVocab& vocab) {
  for (std::size_t i = 0; i < vocab.tokens.size(); ++i) {
    const std::string_view text = vocab.tokens[i];
    const bool control_text =
        is_end_of_generation_text(text) ||
        std::find(std::begin(kFillInTheMiddleTexts), std::end(kFillInTheMiddleTexts), text) !=
            std::end(kFillInTheMiddleTexts);
    if (!control_text) continue;
    if (vocab.token_types.empty()) {
      vocab.token_types.assign(vocab.tokens.size(), static_cast<std::int32_t>(TokenType::normal));
    }
    vocab.token_types[i] = static_cast<std::int32_t>(TokenType::control);
  }
}

// One piece of the input after special tokens are cut out: raw text [begin, end), or one special token.
struct Fragment {
  std::size_t begin = 0;
  std::size_t end = 0;
  token_id token = kNoToken;  // kNoToken: raw text [begin, end)
};

class TokenIndex {
 public:
  // `vocab` must have passed validate() and override_control_token_types().
  explicit TokenIndex(const TokenizerVocab& vocab);

  // The id whose vocabulary text is exactly `text`, or kNoToken.
  [[nodiscard]] token_id find(std::string_view text) const {
    const auto it = text_to_id_.find(text);
    return it == text_to_id_.end() ? kNoToken : it->second;
  }

  [[nodiscard]] const std::string& piece(token_id id) const { return pieces_[static_cast<std::size_t>(id)]; }
  [[nodiscard]] bool end_of_generation(token_id id) const { return eog_[static_cast<std::size_t>(id)]; }

  // Cuts special tokens out of `text`, longest token text first and, for one token, left to right, as
  // llama.cpp's tokenizer_st_partition does. Control and unknown tokens only with parse_special;
  // user-defined tokens always.
  [[nodiscard]] std::vector<Fragment> partition(std::string_view text, bool parse_special,
                                                const TokenizerVocab& vocab) const;

 private:
  static int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }

  std::unordered_map<std::string, token_id, TextHash, std::equal_to<>> text_to_id_;
  std::vector<std::string> pieces_;
  std::vector<bool> eog_;
  std::vector<token_id> special_;  // control, unknown and user-defined tokens, longest text first
};

}  // namespace kvfuse::detail

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/model/token_index_impl.hpp"
#endif
