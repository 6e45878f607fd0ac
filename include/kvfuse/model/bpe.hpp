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
              std::vector<token_id>& out) const {
    const Pcre2MatchData match = make_match_data();
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    std::vector<std::pair<std::size_t, std::size_t>> next;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        continue;
      }
      pieces.assign(1, {f.begin, f.end});
      for (const Pcre2Regex& regex : regexes_) {
        next.clear();
        for (const auto& [b, e] : pieces) regex.split(text.substr(b, e - b), b, match.get(), next);
        pieces.swap(next);
      }
      for (const auto& [b, e] : pieces) merge_piece(text.substr(b, e - b), index, out);
    }
  }

 private:
  struct Merge {
    int rank = 0;
    token_id result = kNoToken;
  };

  static std::uint64_t pair_key(token_id left, token_id right) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }

  void index_merges(const TokenizerVocab& vocab, const TokenIndex& index) {
    merges_.reserve(vocab.merges.size());
    for (std::size_t rank = 0; rank < vocab.merges.size(); ++rank) {
      const std::string& m = vocab.merges[rank];
      const std::size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      require(space != std::string::npos && space + 1 < m.size(), "tokenizer: merge {} '{}' is not 'left right'",
              rank, m);
      const std::string left = m.substr(0, space);
      const std::string right = m.substr(space + 1);
      const token_id l = index.find(left);
      const token_id r = index.find(right);
      const token_id result = index.find(left + right);
      require(l != kNoToken && r != kNoToken && result != kNoToken,
              "tokenizer: merge {} '{}' names a token that is not in the vocabulary", rank, m);
      merges_.emplace(pair_key(l, r), Merge{static_cast<int>(rank), result});  // a repeated pair keeps its first rank
    }
  }

  // BPE over one pre-tokenized piece: start from one token per byte, then repeatedly merge the adjacent
  // pair with the lowest merge rank, the leftmost one among equal ranks (llama.cpp's llm_bigram_bpe order).
  void merge_piece(std::string_view piece, const TokenIndex& index, std::vector<token_id>& out) const {
    if (ignore_merges_) {
      std::string encoded;
      for (char c : piece) encoded += gpt2_byte_text()[static_cast<unsigned char>(c)];
      if (const token_id whole = index.find(encoded); whole != kNoToken) {
        out.push_back(whole);
        return;
      }
    }
    struct Symbol {
      token_id id;
      int prev;
      int next;
    };
    struct Candidate {
      int rank;
      int left;
      token_id left_id;
      token_id right_id;
      bool operator>(const Candidate& o) const noexcept { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    const int n = static_cast<int>(piece.size());
    std::vector<Symbol> sym(piece.size());
    for (int i = 0; i < n; ++i) {
      // A byte without a token keeps its place as kNoToken: it blocks merges across it and is not output.
      const token_id id = byte_token_[static_cast<unsigned char>(piece[static_cast<std::size_t>(i)])];
      sym[static_cast<std::size_t>(i)] = {id, i - 1, i + 1 < n ? i + 1 : -1};
    }
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    auto consider = [&](int left) {
      if (left < 0) return;
      const int right = sym[static_cast<std::size_t>(left)].next;
      if (right < 0) return;
      const token_id a = sym[static_cast<std::size_t>(left)].id;
      const token_id b = sym[static_cast<std::size_t>(right)].id;
      if (a == kNoToken || b == kNoToken) return;
      if (const auto it = merges_.find(pair_key(a, b)); it != merges_.end()) {
        queue.push({it->second.rank, left, a, b});
      }
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = sym[static_cast<std::size_t>(c.left)];
      // Stale when either side has merged since: the left symbol's id changed (it only grows) or its
      // right neighbour is gone or different.
      if (left.id != c.left_id || left.next < 0 || sym[static_cast<std::size_t>(left.next)].id != c.right_id) continue;
      Symbol& right = sym[static_cast<std::size_t>(left.next)];
      left.id = merges_.at(pair_key(c.left_id, c.right_id)).result;
      right.id = kNoToken;
      left.next = right.next;
      if (right.next >= 0) sym[static_cast<std::size_t>(right.next)].prev = c.left;
      consider(left.prev);
      consider(c.left);
    }
    for (int i = 0; i >= 0 && i < n; i = sym[static_cast<std::size_t>(i)].next) {
      if (sym[static_cast<std::size_t>(i)].id != kNoToken) out.push_back(sym[static_cast<std::size_t>(i)].id);
    }
  }

  std::vector<Pcre2Regex> regexes_;
  bool ignore_merges_ = false;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::array<token_id, 256> byte_token_{};
};

}  // namespace kvfuse::detail
