#pragma once
// GPT-2's byte -> unicode map (kvfuse::detail): how a byte-level BPE vocabulary spells each byte as text.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kvfuse/model/utf8.hpp"

namespace kvfuse::detail {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for
// themselves, the other 68 bytes for U+0100 + n in byte order. Entry b is the code point byte b becomes.
[[nodiscard]] constexpr std::array<std::uint32_t, 256> gpt2_byte_to_codepoint() noexcept {
  std::array<std::uint32_t, 256> map{};
  std::uint32_t next = 256;
  for (std::uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? b : next++;
  }
  return map;
}

// The UTF-8 text each byte becomes in a byte-level vocabulary ("Ġ" for ' ', "Ċ" for '\n').
[[nodiscard]] inline const std::array<std::string, 256>& gpt2_byte_text() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    const auto cps = gpt2_byte_to_codepoint();
    for (std::size_t b = 0; b < 256; ++b) t[b] = utf8_encode(cps[b]);
    return t;
  }();
  return table;
}

// Inverse of gpt2_byte_to_codepoint for code points below 0x144 (the largest it produces); -1 elsewhere.
[[nodiscard]] inline int gpt2_codepoint_to_byte(std::uint32_t cp) noexcept {
  static const std::array<int, 0x144> table = [] {
    std::array<int, 0x144> t{};
    t.fill(-1);
    const auto cps = gpt2_byte_to_codepoint();
    for (int b = 0; b < 256; ++b) t[cps[static_cast<std::size_t>(b)]] = b;
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

// Token text back to bytes when every character is in GPT-2's byte alphabet; nullopt otherwise.
// `text` is valid UTF-8.
[[nodiscard]] inline std::optional<std::string> gpt2_byte_decode(std::string_view text) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::uint32_t cp = 0;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0u) == 0xC0u && i + 1 < text.size()) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return std::nullopt;  // 3- and 4-byte characters are all above U+0143
    }
    const int b = gpt2_codepoint_to_byte(cp);
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
  }
  return out;
}

}  // namespace kvfuse::detail
