#pragma once
// TextStream: a request's generated tokens as text, incrementally. Each token adds its bytes (Tokenizer::decode
// without control tokens, token by token: the first token's space prefix dropped as decode drops it); what is
// released never ends inside a UTF-8 sequence still incomplete, nor inside what may become a stop sequence; a stop
// sequence ends the text before it.
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvfuse/core/types.hpp"
#include "kvfuse/model/text_tokenizer.hpp"

namespace kvfuse_server {

// Bytes at the end of `s` that start a UTF-8 sequence longer than what follows them (0 when s ends complete).
[[nodiscard]] inline std::size_t incomplete_utf8_tail(std::string_view s) {
  const std::size_t n = s.size();
  for (std::size_t back = 1; back <= std::min<std::size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const std::size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

class TextStream {
 public:
  TextStream(const kvfuse::Tokenizer& tok, std::vector<std::string> stop) : tok_(&tok), stop_(std::move(stop)) {}

  // Adds token t; returns the text now safe to release (possibly empty). After a stop sequence, stopped() is true
  // and the text ends before it.
  std::string push(kvfuse::token_id t) {
    const kvfuse::TokenType type = tok_->token_type(t);
    if (type != kvfuse::TokenType::control && type != kvfuse::TokenType::unknown) {
      std::string_view piece = tok_->token_piece(t);
      if (first_ && tok_->add_space_prefix() && piece.starts_with(' ')) piece.remove_prefix(1);
      pending_ += piece;
    }
    first_ = false;
    return release(false);
  }

  // The rest of the text at the end of generation (a partial stop sequence or UTF-8 sequence included).
  std::string finish() { return release(true); }

  [[nodiscard]] bool stopped() const noexcept { return stopped_; }
  // Everything released so far.
  [[nodiscard]] const std::string& text() const noexcept { return text_; }

 private:
  std::string release(bool all) {
    if (stopped_) return {};
    std::size_t cut = pending_.size();
    for (const std::string& s : stop_) {
      if (const std::size_t at = pending_.find(s); at != std::string::npos && at < cut) {
        cut = at;
        stopped_ = true;
      }
    }
    if (!stopped_ && !all) {
      // Hold back the longest tail that is the beginning of a stop sequence, and an incomplete UTF-8 sequence.
      std::size_t hold = 0;
      for (const std::string& s : stop_)
        for (std::size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k)
          if (std::string_view(pending_).substr(pending_.size() - k) == std::string_view(s).substr(0, k)) {
            hold = k;
            break;
          }
      cut = pending_.size() - hold;
      cut -= incomplete_utf8_tail(std::string_view(pending_).substr(0, cut));
    }
    std::string out = pending_.substr(0, cut);
    pending_.erase(0, stopped_ ? pending_.size() : cut);
    text_ += out;
    return out;
  }

  const kvfuse::Tokenizer* tok_;
  std::vector<std::string> stop_;
  std::string pending_;  // decoded, not yet released
  std::string text_;
  bool first_ = true;
  bool stopped_ = false;
};

}  // namespace kvfuse_server
