#pragma once
// The out-of-class member functions of model/token_index.hpp (the class and what each does are there). It includes this
// file at its end unless KVFUSE_CPU_SEPARATE_COMPILATION is defined (core/config.hpp).

#include "kvfuse/model/token_index.hpp"

namespace kvfuse::detail {

KVFUSE_CPU_INLINE TokenIndex::TokenIndex(const TokenizerVocab& vocab) {
  const std::size_t n = vocab.tokens.size();
  const bool spm = vocab.model == "llama";
  text_to_id_.reserve(n);
  pieces_.resize(n);
  eog_.assign(n, false);
  for (std::size_t i = 0; i < n; ++i) {
    const auto id = static_cast<token_id>(i);
    const std::string& text = vocab.tokens[i];
    const auto [it, inserted] = text_to_id_.emplace(text, id);
    require(inserted, "tokenizer: token text '{}' appears twice (ids {} and {})", text, it->second, id);
    const TokenType type = vocab.type_of(id);
    switch (type) {
      case TokenType::normal:
        pieces_[i] = spm ? replace_all(text, kSpmSpace, " ") : gpt2_byte_decode(text).value_or(text);
        break;
      case TokenType::control:
      case TokenType::unknown:
      case TokenType::user_defined:
        pieces_[i] = text;
        if (!text.empty()) special_.push_back(id);
        break;
      case TokenType::byte: {  // "<0xAB>" stands for the byte 0xAB
        const int hi = hex_digit(text.size() == 6 ? text[3] : 'x');
        const int lo = hex_digit(text.size() == 6 ? text[4] : 'x');
        require(text.starts_with("<0x") && text.ends_with('>') && hi >= 0 && lo >= 0,
                "tokenizer: byte token {} is '{}', not '<0xHH>'", i, text);
        pieces_[i] = std::string(1, static_cast<char>(hi * 16 + lo));
        break;
      }
      case TokenType::undefined:
      case TokenType::unused:
        break;  // stands for nothing, as in llama.cpp
    }
    eog_[i] = id == vocab.eos || is_end_of_generation_text(text);  // control tokens, by the override
  }
  // Longest special text first, then lower id: the order llama.cpp cuts them out of the text in.
  std::stable_sort(special_.begin(), special_.end(), [&](token_id a, token_id b) {
    return vocab.tokens[static_cast<std::size_t>(a)].size() > vocab.tokens[static_cast<std::size_t>(b)].size();
  });
}

KVFUSE_CPU_INLINE std::vector<Fragment> TokenIndex::partition(std::string_view text, bool parse_special,
                                                   const TokenizerVocab& vocab) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({0, text.size(), kNoToken});
  std::vector<Fragment> next;
  for (const token_id id : special_) {
    if (!parse_special && vocab.type_of(id) != TokenType::user_defined) continue;
    const std::string& needle = vocab.tokens[static_cast<std::size_t>(id)];
    if (text.find(needle) == std::string_view::npos) continue;  // most special tokens are not in the text
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      std::size_t pos = f.begin;
      while (pos < f.end) {
        const std::size_t hit = text.substr(0, f.end).find(needle, pos);
        if (hit == std::string_view::npos) break;
        if (hit > pos) next.push_back({pos, hit, kNoToken});
        next.push_back({hit, hit + needle.size(), id});
        pos = hit + needle.size();
      }
      if (pos < f.end) next.push_back({pos, f.end, kNoToken});
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace kvfuse::detail
