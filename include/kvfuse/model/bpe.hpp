#pragma once
// detail::BPEModel: llama.cpp's byte-level BPE (`tokenizer.ggml.model = "gpt2"`), the encoding half of
// kvfuse::Tokenizer (model/text_tokenizer.hpp) for such vocabularies.
//
// What it does
//   BPEModel reproduces llama.cpp's tokenizer for `tokenizer.ggml.model = "gpt2"` (src/llama-vocab.cpp,
//   llm_tokenizer_bpe): (1) control / user-defined / unknown tokens are cut out of the raw text first,
//   longest token text first, as llama_vocab::impl::tokenizer_st_partition does (detail::TokenIndex);
//   (2) every other piece is split by the pre-tokenizer regexes the file names in `tokenizer.ggml.pre`
//   (model/pretokenizer.hpp), applied one after another with llama.cpp's "isolated" semantics (matches and
//   the gaps between them both become pieces); (3) each piece is byte-encoded with GPT-2's byte -> unicode
//   map (model/byte_map.hpp) and merged by BPE, lowest merge rank first and, among equal ranks, the leftmost
//   pair first. Unicode categories (\p{L}, \p{N}, \s) come from PCRE2 (PCRE2_UTF | PCRE2_UCP), not from
//   tables here.
//
// Where kvfuse differs from llama.cpp, on purpose
//   - Invalid UTF-8 input throws kvfuse::error naming the byte offset (llama.cpp silently turns each bad
//     byte into U+FFFD; Hugging Face tokenizers cannot take such input at all).
//   - Unassigned code points join a `[^\s\p{L}\p{N}]+` run as the regex (and Hugging Face) says; llama.cpp's
//     hand-written GPT-2 splitter cuts them into single characters.
//   - Tokenizer::decode concatenates token bytes exactly; it does not "clean up" spaces before punctuation.
// Same as llama.cpp and Hugging Face, worth knowing
//   - A byte with no token in the vocabulary is dropped from the output and takes part in no merge.
//     SmolLM2's vocabulary lacks 21 of the 256 byte symbols: U+0004, U+0006, U+0013, U+0014, U+0016,
//     U+001D, the lead bytes F1/F2 of planes 4-11 and bytes that never occur in UTF-8, so
//     decode(encode(text)) == text except for those bytes.
// Checked against Hugging Face tokenizers on the SmolLM2 vocabulary for all four pre-tokenizer families
// (tests/data/tokenizer_cases.txt; make_tokenizer_cases.py says how the reference is built).
//
// Dependencies: PCRE2 8-bit (Debian libpcre2-dev; pkg-config module `libpcre2-8`), linked by kvfuse::cpu.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvfuse/core/config.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/byte_map.hpp"
#include "kvfuse/model/pretokenizer.hpp"
#include "kvfuse/model/regex.hpp"
#include "kvfuse/model/token_index.hpp"
#include "kvfuse/model/vocab.hpp"

namespace kvfuse::detail {

class BPEModel {
 public:
  // `vocab` must have passed validate() and be a "gpt2" vocabulary; `index` is built from it.
  BPEModel(const TokenizerVocab& vocab, const TokenIndex& index) {
    const auto spec = *pre_tokenizer_spec(vocab.pre);
    for (std::string_view r : spec.regexes) regexes_.emplace_back(r);
    ignore_merges_ = spec.ignore_merges;
    const auto& bytes = gpt2_byte_text();
    for (std::size_t b = 0; b < 256; ++b) byte_token_[b] = index.find(bytes[b]);
    index_merges(vocab, index);
  }

  // Appends the ids of `text` (valid UTF-8), already cut into fragments by TokenIndex::partition.
  void encode(std::string_view text, std::span<const Fragment> fragments, const TokenIndex& index,
              std::vector<token_id>& out) const;

 private:
  struct Merge {
    int rank = 0;
    token_id result = kNoToken;
  };

  static std::uint64_t pair_key(token_id left, token_id right) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }

  void index_merges(const TokenizerVocab& vocab, const TokenIndex& index);

  // BPE over one pre-tokenized piece: start from one token per byte, then repeatedly merge the adjacent
  // pair with the lowest merge rank, the leftmost one among equal ranks (llama.cpp's llm_bigram_bpe order).
  void merge_piece(std::string_view piece, const TokenIndex& index, std::vector<token_id>& out) const;

  std::vector<Pcre2Regex> regexes_;
  bool ignore_merges_ = false;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<token_id, 256> byte_token_{};
};

}  // namespace kvfuse::detail

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/model/bpe_impl.hpp"
#endif
