#pragma once
// The out-of-class member functions of model/text_tokenizer.hpp (the class and what each does are there). It
// includes this file at its end unless KVFUSE_CPU_SEPARATE_COMPILATION is defined (core/config.hpp).

#include "kvfuse/model/text_tokenizer.hpp"

namespace kvfuse {

KVFUSE_CPU_INLINE std::vector<token_id> Tokenizer::encode(std::string_view text, bool parse_special) const {
  detail::require_utf8(text, "input text");
  std::vector<token_id> out;
  const std::vector<detail::Fragment> fragments = index_.partition(text, parse_special, vocab_);
  if (const auto* bpe = std::get_if<detail::BPEModel>(&model_)) {
    bpe->encode(text, fragments, index_, out);
  } else {
    std::get<detail::SPMModel>(model_).encode(text, fragments, vocab_, index_, out);
  }
  return out;
}

KVFUSE_CPU_INLINE std::vector<token_id> Tokenizer::tokenize(std::string_view text, bool add_special,
                                                            bool parse_special) const {
  std::vector<token_id> out;
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);
  const std::vector<token_id> body = encode(text, parse_special);
  out.insert(out.end(), body.begin(), body.end());
  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos);
  return out;
}

KVFUSE_CPU_INLINE std::string Tokenizer::decode(std::span<const token_id> ids, bool render_special) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    check_id(ids[i], "decode");
    const TokenType type = vocab_.type_of(ids[i]);
    if (!render_special && (type == TokenType::control || type == TokenType::unknown)) continue;
    std::string_view piece = index_.piece(ids[i]);
    if (i == 0 && vocab_.add_space_prefix && piece.starts_with(' ')) piece.remove_prefix(1);
    out += piece;
  }
  return out;
}

}  // namespace kvfuse
