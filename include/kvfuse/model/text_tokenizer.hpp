#pragma once
// Tokenizer: the tokenizer of a GGUF vocabulary (TokenizerVocab, model/vocab.hpp), byte-level BPE or
// SentencePiece BPE as the file's `tokenizer.ggml.model` says; BPETokenizer: one that only takes BPE.
//
//   "gpt2"   llama.cpp's llm_tokenizer_bpe: special tokens, pre-tokenizer regexes, BPE by merge rank
//            (detail::BPEModel, model/bpe.hpp), e.g. SmolLM2
//   "llama"  llama.cpp's llm_tokenizer_spm: special tokens, optional space prefix, "▁" for spaces, BPE by
//            token score, byte fallback (detail::SPMModel, model/spm.hpp), e.g. Gemma 3
// Both cut control / user-defined / unknown tokens out of the text first (detail::TokenIndex).
//
// encode() never adds BOS/EOS; tokenize() does what llama.cpp's llama_tokenize does with add_special
// (BOS when add_bos(), EOS when add_eos()). decode() is llama.cpp's llama_detokenize without
// remove_special: each token's bytes (token_piece), control and unknown tokens only with render_special,
// and, for a vocabulary with a space prefix, the first token's leading space dropped. It does not "clean
// up" spaces before punctuation.
// Defaults: encode() parses control-token text (parse_special = true).
// A Tokenizer is immutable after construction; encode/decode may run concurrently on one instance.
//
// Dependencies: PCRE2 8-bit (Debian libpcre2-dev; pkg-config module `libpcre2-8`), linked by kvfuse::cpu.

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/bpe.hpp"
#include "kvfuse/model/chat_template.hpp"
#include "kvfuse/model/gguf.hpp"
#include "kvfuse/model/spm.hpp"
#include "kvfuse/model/token_index.hpp"
#include "kvfuse/model/utf8.hpp"
#include "kvfuse/model/vocab.hpp"

namespace kvfuse {

class Tokenizer {
 public:
  // Validates the vocabulary (kvfuse::error naming the first bad field or an unsupported model) and
  // indexes it for the model it names.
  explicit Tokenizer(TokenizerVocab vocab)
      : vocab_(validated(std::move(vocab))), index_(vocab_), model_(make_model(vocab_, index_)) {}

  [[nodiscard]] static Tokenizer from_gguf(const GGUFFile& file) { return Tokenizer(TokenizerVocab::from_gguf(file)); }

  // Token ids of `text` (UTF-8). With parse_special, the text of control tokens ("<|im_start|>",
  // "<start_of_turn>") becomes those tokens; without, it is tokenized as plain text. User-defined tokens are
  // matched either way, as in llama.cpp. Never adds BOS/EOS: see tokenize(), add_bos(), add_eos().
  [[nodiscard]] std::vector<token_id> encode(std::string_view text, bool parse_special = true) const;

  // llama.cpp's llama_tokenize: encode(), with BOS first when add_special and add_bos(), and EOS last when
  // add_special and add_eos().
  [[nodiscard]] std::vector<token_id> tokenize(std::string_view text, bool add_special,
                                               bool parse_special = true) const;

  // The bytes the tokens stand for, concatenated. Control and unknown tokens appear as their text when
  // render_special is true and are left out otherwise (llama.cpp's `special` flag). With add_space_prefix()
  // one leading space of the first token is dropped, as llama.cpp's llama_detokenize does. Throws on an id
  // outside the vocabulary.
  [[nodiscard]] std::string decode(std::span<const token_id> ids, bool render_special = true) const;

  // The token's text as the vocabulary stores it ("Ġthe" in a BPE vocabulary, "▁the" in a SentencePiece one).
  [[nodiscard]] std::string_view token_text(token_id id) const {
    check_id(id, "token_text");
    return vocab_.tokens[static_cast<std::size_t>(id)];
  }

  // The bytes the token stands for (" the"); a control token's own text ("<|im_end|>"); llama.cpp's
  // token_to_piece with special = true.
  [[nodiscard]] std::string_view token_piece(token_id id) const {
    check_id(id, "token_piece");
    return index_.piece(id);
  }

  // The id whose vocabulary text is exactly `text`, or kNoToken.
  [[nodiscard]] token_id find_token(std::string_view text) const { return index_.find(text); }

  // The token's type as llama.cpp uses it: the file's, except that tokens with control-looking text are
  // control tokens (detail::override_control_token_types).
  [[nodiscard]] TokenType token_type(token_id id) const {
    check_id(id, "token_type");
    return vocab_.type_of(id);
  }

  // True for tokens that end a generated turn: eos, and the tokens llama.cpp treats as end of generation by
  // their text ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "</s>", fill-in-the-middle
  // repository / separator / pad tokens; detail::kEndOfGenerationTexts).
  [[nodiscard]] bool is_end_of_generation(token_id id) const {
    check_id(id, "is_end_of_generation");
    return index_.end_of_generation(id);
  }

  [[nodiscard]] token_id bos() const noexcept { return vocab_.bos; }
  [[nodiscard]] token_id eos() const noexcept { return vocab_.eos; }
  [[nodiscard]] bool add_bos() const noexcept { return vocab_.add_bos; }
  [[nodiscard]] bool add_eos() const noexcept { return vocab_.add_eos; }
  [[nodiscard]] bool add_space_prefix() const noexcept { return vocab_.add_space_prefix; }
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_.tokens.size(); }
  // "gpt2" (byte-level BPE) or "llama" (SentencePiece BPE).
  [[nodiscard]] const std::string& model() const noexcept { return vocab_.model; }
  // The BPE pre-tokenizer ("smollm", ...); whatever the file says, unused, for a SentencePiece vocabulary.
  [[nodiscard]] const std::string& pre_tokenizer() const noexcept { return vocab_.pre; }
  // The Jinja source of the chat template; empty for a base model without one.
  [[nodiscard]] const std::string& chat_template() const noexcept { return vocab_.chat_template; }

  // The messages in the vocabulary's chat template; throws kvfuse::error if the template is not ChatML
  // (or absent).
  [[nodiscard]] std::string format_chat(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
    return ChatTemplate(vocab_.chat_template).format(messages, add_generation_prompt);
  }

 private:
  static TokenizerVocab validated(TokenizerVocab vocab) {
    vocab.validate();
    detail::override_control_token_types(vocab);
    return vocab;
  }

  static std::variant<detail::BPEModel, detail::SPMModel> make_model(const TokenizerVocab& vocab,
                                                                     const detail::TokenIndex& index) {
    if (vocab.model == "gpt2") return detail::BPEModel(vocab, index);
    return detail::SPMModel(index);  // validate() admits only gpt2 and llama
  }

  void check_id(token_id id, const char* what) const {
    detail::require(id >= 0 && static_cast<std::size_t>(id) < vocab_.tokens.size(),
                    "tokenizer: {}: token id {} is not in [0, {})", what, id, vocab_.tokens.size());
  }

  TokenizerVocab vocab_;
  detail::TokenIndex index_;
  std::variant<detail::BPEModel, detail::SPMModel> model_;
};

// A Tokenizer that only takes byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`); anything
// else throws kvfuse::error naming the model. Code that should also run SentencePiece models (Gemma 3)
// uses Tokenizer.
class BPETokenizer : public Tokenizer {
 public:
  explicit BPETokenizer(TokenizerVocab vocab) : Tokenizer(bpe_only(std::move(vocab))) {}

 private:
  static TokenizerVocab bpe_only(TokenizerVocab vocab) {
    detail::require(vocab.model == "gpt2",
                    "tokenizer: BPETokenizer takes byte-level BPE vocabularies ('gpt2'), not '{}'; "
                    "kvfuse::Tokenizer takes both gpt2 and llama",
                    vocab.model);
    return vocab;
  }
};

}  // namespace kvfuse

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/model/text_tokenizer_impl.hpp"
#endif
