#pragma once
// The out-of-class member functions of model/spm.hpp (the class and what each does are there). It includes this
// file at its end unless KVFUSE_CPU_SEPARATE_COMPILATION is defined (core/config.hpp).

#include "kvfuse/model/spm.hpp"

namespace kvfuse::detail {

KVFUSE_CPU_INLINE void SPMModel::encode(std::string_view text, std::span<const Fragment> fragments,
                                        const TokenizerVocab& vocab, const TokenIndex& index,
                                        std::vector<token_id>& out) const {
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

KVFUSE_CPU_INLINE void SPMModel::merge_fragment(std::string_view s, std::size_t offset, const TokenizerVocab& vocab,
                                                const TokenIndex& index, std::vector<token_id>& out) const {
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

}  // namespace kvfuse::detail
