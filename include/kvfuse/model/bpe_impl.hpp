#pragma once
// The out-of-class member functions of model/bpe.hpp (the class and what each does are there). It includes this
// file at its end unless KVFUSE_CPU_SEPARATE_COMPILATION is defined (core/config.hpp).

#include "kvfuse/model/bpe.hpp"

namespace kvfuse::detail {

KVFUSE_CPU_INLINE void BPEModel::encode(std::string_view text, std::span<const Fragment> fragments,
                                        const TokenIndex& index, std::vector<token_id>& out) const {
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

KVFUSE_CPU_INLINE void BPEModel::index_merges(const TokenizerVocab& vocab, const TokenIndex& index) {
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

KVFUSE_CPU_INLINE void BPEModel::merge_piece(std::string_view piece, const TokenIndex& index,
                                             std::vector<token_id>& out) const {
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

}  // namespace kvfuse::detail
