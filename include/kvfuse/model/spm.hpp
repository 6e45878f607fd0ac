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
              const TokenIndex& index, std::vector<token_id>& out) const {
    bool after_special = true;  // the text's start counts as following a special token
    std::string escaped;
    for (const Fragment& f : fragments) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        after_special = true;
        continue;
      }
      const std::string_view raw = text.substr(f.begin, f.end - f.begin);
      std::string spaced;
      if (vocab.add_space_prefix && after_special) spaced.push_back(' ');
      spaced.append(raw);
      escaped = replace_all(spaced, " ", kSpmSpace);
      merge_fragment(escaped, f.begin, vocab, index, out);
      after_special = false;
    }
  }

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
                      std::vector<token_id>& out) const {
    std::vector<Symbol> sym;
    for (std::size_t pos = 0; pos < s.size();) {
      const std::size_t len = utf8_length(static_cast<unsigned char>(s[pos]));
      const int i = static_cast<int>(sym.size());
      sym.push_back({pos, len, i - 1, pos + len < s.size() ? i + 1 : -1});
      pos += len;
    }
    std::priority_queue<Bigram, std::vector<Bigram>, Lower> queue;
    auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const Symbol& l = sym[static_cast<std::size_t>(left)];
      const std::size_t size = l.size + sym[static_cast<std::size_t>(right)].size;
      const token_id id = index.find(s.substr(l.begin, size));
      if (id == kNoToken) return;
      const float score = vocab.scores.empty() ? 0.0f : vocab.scores[static_cast<std::size_t>(id)];
      queue.push({left, right, score, size});
    };
    for (int i = 1; i < static_cast<int>(sym.size()); ++i) consider(i - 1, i);
    while (!queue.empty()) {
      const Bigram b = queue.top();
      queue.pop();
      Symbol& left = sym[static_cast<std::size_t>(b.left)];
      Symbol& right = sym[static_cast<std::size_t>(b.right)];
      // Stale when either symbol has merged since: one is gone or they no longer add up to the pair.
      if (left.size == 0 || right.size == 0 || left.size + right.size != b.size) continue;
      left.size += right.size;
      right.size = 0;
      left.next = right.next;
      if (right.next >= 0) sym[static_cast<std::size_t>(right.next)].prev = b.left;
      consider(left.prev, b.left);
      consider(b.left, left.next);
    }
    for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[static_cast<std::size_t>(i)].next) {
      const Symbol& x = sym[static_cast<std::size_t>(i)];
      const std::string_view piece = s.substr(x.begin, x.size);
      if (const token_id id = index.find(piece); id != kNoToken) {
        out.push_back(id);
        continue;
      }
      bool all_bytes = true;
      for (const char c : piece) all_bytes = all_bytes && byte_token_[static_cast<unsigned char>(c)] != kNoToken;
      if (all_bytes) {
        for (const char c : piece) out.push_back(byte_token_[static_cast<unsigned char>(c)]);
        continue;
      }
      require(vocab.unk != kNoToken,
              "tokenizer: '{}' (in the text fragment at byte offset {}) is no token, and the vocabulary has "
              "neither its byte tokens nor an unk token",
              piece, offset);
      out.push_back(vocab.unk);
    }
  }

  std::array<token_id, 256> byte_token_{};
};

}  // namespace kvfuse::detail
