#pragma once
// UTF-8 checks and encoding for the tokenizer (kvfuse::detail).
//
// The tokenizer refuses invalid UTF-8 with kvfuse::error naming the byte offset (llama.cpp silently turns
// each bad byte into U+FFFD; Hugging Face tokenizers cannot take such input at all).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvfuse/core/error.hpp"

namespace kvfuse {

// Offset of the first byte that is not part of valid UTF-8 (RFC 3629: no overlong forms, no surrogates,
// nothing above U+10FFFF), or text.size() when all of it is valid.
[[nodiscard]] inline std::size_t utf8_invalid_offset(std::string_view text) noexcept {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    std::size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // no overlong 3-byte forms
      if (c == 0xED) hi = 0x9F;  // no UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // no overlong 4-byte forms
      if (c == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k) {
      if ((s[i + k] & 0xC0u) != 0x80u) return i;
    }
    i += len;
  }
  return n;
}

}  // namespace kvfuse

namespace kvfuse::detail {

using kvfuse::utf8_invalid_offset;


// Throws kvfuse::error naming `what`, the offset and the byte when `text` is not valid UTF-8.
inline void require_utf8(std::string_view text, std::string_view what) {
  const std::size_t bad = utf8_invalid_offset(text);
  require(bad == text.size(), "tokenizer: {} is not valid UTF-8 at byte offset {} (byte 0x{:02x})", what, bad,
          bad < text.size() ? static_cast<unsigned char>(text[bad]) : 0u);
}

// UTF-8 of a code point below U+10000 (one to three bytes; the GPT-2 byte map needs no more).
[[nodiscard]] inline std::string utf8_encode(std::uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0u | (cp >> 6));
    out += static_cast<char>(0x80u | (cp & 0x3Fu));
  } else {
    out += static_cast<char>(0xE0u | (cp >> 12));
    out += static_cast<char>(0x80u | ((cp >> 6) & 0x3Fu));
    out += static_cast<char>(0x80u | (cp & 0x3Fu));
  }
  return out;
}

}  // namespace kvfuse::detail
