#pragma once
// A PCRE2 regex for the tokenizer's pre-tokenizers (kvfuse::detail): compiled with PCRE2_UTF | PCRE2_UCP, so
// Unicode categories (\p{L}, \p{N}, \s) come from PCRE2, not from tables here.
//
// Dependencies: PCRE2 8-bit (Debian libpcre2-dev; pkg-config module `libpcre2-8`), linked by kvfuse::cpu.

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <fmt/format.h>
#include <pcre2.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvfuse/core/error.hpp"

namespace kvfuse::detail {

// Match data for one search (PCRE2 match data must not be shared between threads).
struct MatchFree {
  void operator()(pcre2_match_data_8* p) const noexcept { pcre2_match_data_free_8(p); }
};
using Pcre2MatchData = std::unique_ptr<pcre2_match_data_8, MatchFree>;

// Compiled PCRE2 pattern (UTF + UCP), freed on destruction; copies share nothing.
class Pcre2Regex {
 public:
  explicit Pcre2Regex(std::string_view pattern) : pattern_(pattern) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    code_.reset(pcre2_compile_8(reinterpret_cast<PCRE2_SPTR8>(pattern_.data()), pattern_.size(), PCRE2_UTF | PCRE2_UCP,
                                &code, &offset, nullptr));
    require(code_ != nullptr, "tokenizer: regex '{}' does not compile at offset {}: {}", pattern_, offset,
            message(code));
  }
  Pcre2Regex(const Pcre2Regex& other) : pattern_(other.pattern_), code_(pcre2_code_copy_8(other.code_.get())) {
    require(code_ != nullptr, "tokenizer: out of memory copying regex '{}'", pattern_);
  }
  Pcre2Regex& operator=(const Pcre2Regex& other) {
    if (this != &other) *this = Pcre2Regex(other);
    return *this;
  }
  Pcre2Regex(Pcre2Regex&&) noexcept = default;
  Pcre2Regex& operator=(Pcre2Regex&&) noexcept = default;
  ~Pcre2Regex() = default;

  // Splits `piece` (valid UTF-8, already checked) into matches and the gaps between them, in order,
  // appending [begin, end) offsets shifted by `base`: llama.cpp's unicode_regex_split on one fragment.
  // The piece is the whole subject, so a lookahead at its end sees the end of the string.
  void split(std::string_view piece, std::size_t base, pcre2_match_data_8* match,
             std::vector<std::pair<std::size_t, std::size_t>>& out) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR8>(piece.data());
    std::size_t start = 0;  // where the next search begins
    std::size_t done = 0;   // end of what has been emitted
    while (start < piece.size()) {
      const int rc = pcre2_match_8(code_.get(), subject, piece.size(), start, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      require(rc >= 0, "tokenizer: regex '{}' failed: {}", pattern_, message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer_8(match);
      const std::size_t begin = ov[0];
      const std::size_t end = ov[1];
      if (begin > done) out.emplace_back(base + done, base + begin);
      if (end > begin) {
        out.emplace_back(base + begin, base + end);
        done = end;
        start = end;
      } else {  // an empty match emits nothing; step over one code point so the search moves on
        start = begin + 1;
        while (start < piece.size() && (static_cast<unsigned char>(piece[start]) & 0xC0u) == 0x80u) ++start;
      }
    }
    if (done < piece.size()) out.emplace_back(base + done, base + piece.size());
  }

  // [begin, end) of capture group `group` in the first match in `subject` (valid UTF-8), or nullopt when
  // there is no match or the group did not take part.
  [[nodiscard]] std::optional<std::pair<std::size_t, std::size_t>> find_group(std::string_view subject,
                                                                              std::uint32_t group) const {
    const Pcre2MatchData match(pcre2_match_data_create_from_pattern_8(code_.get(), nullptr));
    require(match != nullptr, "tokenizer: out of memory allocating PCRE2 match data");
    const int rc = pcre2_match_8(code_.get(), reinterpret_cast<PCRE2_SPTR8>(subject.data()), subject.size(), 0,
                                 PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
    require(rc >= 0, "tokenizer: regex '{}' failed: {}", pattern_, message(rc));
    if (group >= pcre2_get_ovector_count_8(match.get())) return std::nullopt;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer_8(match.get());
    if (ov[2 * group] == PCRE2_UNSET) return std::nullopt;
    return std::pair<std::size_t, std::size_t>{ov[2 * group], ov[2 * group + 1]};
  }

  static std::string message(int code) {
    std::array<PCRE2_UCHAR8, 256> buffer{};
    const int n = pcre2_get_error_message_8(code, buffer.data(), buffer.size());
    return n < 0 ? fmt::format("PCRE2 error {}", code) : std::string(reinterpret_cast<const char*>(buffer.data()));
  }

 private:
  struct Free {
    void operator()(pcre2_code_8* p) const noexcept { pcre2_code_free_8(p); }
  };
  std::string pattern_;
  std::unique_ptr<pcre2_code_8, Free> code_;
};

[[nodiscard]] inline Pcre2MatchData make_match_data() {
  Pcre2MatchData data(pcre2_match_data_create_8(1, nullptr));  // group 0 only
  require(data != nullptr, "tokenizer: out of memory allocating PCRE2 match data");
  return data;
}

}  // namespace kvfuse::detail
