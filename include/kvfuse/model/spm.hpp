#pragma once
// detail::SPMModel: llama.cpp's SentencePiece BPE (`tokenizer.ggml.model = "llama"`), the encoding half of
// kvfuse::Tokenizer (model/text_tokenizer.hpp) for such vocabularies (Llama 2, Gemma 3, ...).
//
// What it does, step for step as llama.cpp's llm_tokenizer_spm_session (src/llama-vocab.cpp)
//   (1) Control / user-defined / unknown tokens are cut out of the raw text first, longest token text first
//       (detail::TokenIndex::partition; Gemma 3's newline and tab runs are user-defined tokens, so they are
//       always cut out, parse_special or not).
//   (2) Each remaining fragment gets a leading " " when the vocabulary asks for a space prefix
//       (add_space_prefix) and the fragment starts the text or follows a special token; then every " "
//       becomes SentencePiece's U+2581 ("▁"). No other normalization.
//   (3) The fragment becomes one symbol per UTF-8 character. Every adjacent pair whose concatenated text
//       is a vocabulary token is a candidate; the candidate with the highest token score merges first and,
//       among equal scores, the leftmost one (llama.cpp's llm_bigram_spm comparator). A merge makes the
//       pairs with its new neighbours candidates; a candidate whose symbols have merged since is skipped.
//   (4) Each final symbol is emitted as its token; a symbol that is no token (a character outside the
//       vocabulary) is emitted byte by byte as the byte tokens "<0xHH>" (SentencePiece's byte fallback).
//       llama.cpp's resegment also looks the text up in the merges it recorded, but only for a text that
//       is no token, and every recorded merge is a token, so that lookup never succeeds and is left out.
// Where kvfuse differs from llama.cpp, on purpose
//   - Invalid UTF-8 input throws kvfuse::error naming the byte offset (llama.cpp cuts a bad byte into a
//     symbol of its own and byte-falls it back).
//   - A character that is no token in a vocabulary without byte tokens for all its bytes becomes one unk
//     token, as SentencePiece without byte fallback emits; without an unk token it throws kvfuse::error
//     naming the byte offset (llama.cpp throws std::out_of_range from its byte lookup in both cases).
// Checked against llama.cpp itself (llama-cpp-python) on the Gemma 3 vocabulary
// (tests/data/spm_tokenizer_cases.txt; make_spm_tokenizer_cases.py says how the reference is built).

#include <array>
#include <cstddef>
#include <cstdint>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/token_index.hpp"
#include "kvfuse/model/vocab.hpp"

namespace kvfuse::detail {

class SPMModel {
 public:
  // `index` is built from a validated "llama" vocabulary.
  explicit SPMModel(const TokenIndex& index) {
    static constexpr char hex[] = "0123456789ABCDEF";
    for (std::size_t b = 0; b < 256; ++b) {
      const char text[] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>'};  // llama.cpp's byte_to_token spelling
      byte_token_[b] = index.find(std::string_view(text, sizeof text));
    }
  }

  // Appends the ids of `text` (valid UTF-8), already cut into fragments by TokenIndex::partition.
  void encode(std::string_view text, std::span<const Fragment> fragments, const TokenizerVocab& vocab,
              const TokenIndex& index, std::vector<token_id>& out) const;

 private:
  struct Symbol {
    std::size_t begin;  // byte offset in the escaped fragment
    std::size_t size;   // bytes; 0 once merged into its left neighbour
    int prev;
    int next;
  };

  // A candidate merge of symbols `left` and `right`, whose texts together are `size` bytes.
  struct Bigram {
    int left;
    int right;
    float score;
    std::size_t size;
  };

  // Priority-queue order: the top is the highest score, then the lowest left symbol (llama.cpp's
  // llm_bigram_spm::comparator).
  struct Lower {
    bool operator()(const Bigram& l, const Bigram& r) const noexcept {
      return l.score < r.score || (l.score == r.score && l.left > r.left);
    }
  };

  static std::size_t utf8_length(unsigned char lead) noexcept {
    return lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;  // the input is valid UTF-8
  }

  // `s` is one escaped fragment; `offset` is where the fragment starts in the caller's text (for errors).
  void merge_fragment(std::string_view s, std::size_t offset, const TokenizerVocab& vocab, const TokenIndex& index,
                      std::vector<token_id>& out) const;

  std::array<token_id, 256> byte_token_{};
};

}  // namespace kvfuse::detail

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/model/spm_impl.hpp"
#endif
