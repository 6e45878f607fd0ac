#pragma once
// Byte-level BPE tokenizer read from GGUF metadata, the model's chat template, and a RAG prompt builder
// that returns the token ranges of its reusable segments.
//
// What it does
//   BPETokenizer reproduces llama.cpp's tokenizer for `tokenizer.ggml.model = "gpt2"` (src/llama-vocab.cpp,
//   llm_tokenizer_bpe): (1) control / user-defined / unknown tokens are cut out of the raw text first,
//   longest token text first, as llama_vocab::impl::tokenizer_st_partition does; (2) every other piece is
//   split by the pre-tokenizer regexes the file names in `tokenizer.ggml.pre`, applied one after another
//   with llama.cpp's "isolated" semantics (matches and the gaps between them both become pieces); (3) each
//   piece is byte-encoded with GPT-2's byte -> unicode map and merged by BPE, lowest merge rank first and,
//   among equal ranks, the leftmost pair first.
//   Unicode categories (\p{L}, \p{N}, \s) come from PCRE2 (PCRE2_UTF | PCRE2_UCP), not from tables here.
//
// Pre-tokenizers (regexes copied from llama.cpp's llm_tokenizer_bpe constructor; PCRE2 syntax)
//   "smollm", "starcoder", "refact"   \p{N}   then the GPT-2 regex          (LLAMA_VOCAB_PRE_TYPE_SMOLLM ...)
//   "gpt-2"                           the GPT-2 regex                      (LLAMA_VOCAB_PRE_TYPE_GPT2)
//   "llama3", "llama-v3", "llama-bpe" the Llama 3 regex, and a piece that is a whole vocabulary token is
//                                     emitted without merging (llama.cpp's ignore_merges)
//   "default"                         llama.cpp's four-regex default list (LLAMA_VOCAB_PRE_TYPE_DEFAULT)
//   GPT-2 regex: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   Any other tokenizer model or pre-tokenizer, and a missing `tokenizer.ggml.pre`, is refused with
//   kvfuse::error naming it (llama.cpp falls back to "default" with a warning; kvfuse does not guess).
//
// Where kvfuse differs from llama.cpp, on purpose
//   - Invalid UTF-8 input throws kvfuse::error naming the byte offset (llama.cpp silently turns each bad
//     byte into U+FFFD; Hugging Face tokenizers cannot take such input at all).
//   - Unassigned code points join a `[^\s\p{L}\p{N}]+` run as the regex (and Hugging Face) says; llama.cpp's
//     hand-written GPT-2 splitter cuts them into single characters.
//   - decode() concatenates token bytes exactly; it does not "clean up" spaces before punctuation.
// Same as llama.cpp and Hugging Face, worth knowing
//   - A byte with no token in the vocabulary is dropped from the output and takes part in no merge.
//     SmolLM2's vocabulary lacks 21 of the 256 byte symbols: U+0004, U+0006, U+0013, U+0014, U+0016,
//     U+001D, the lead bytes F1/F2 of planes 4-11 and bytes that never occur in UTF-8, so
//     decode(encode(text)) == text except for those bytes.
// Checked against Hugging Face tokenizers on the SmolLM2 vocabulary for all four pre-tokenizer families
// (tests/data/tokenizer_cases.txt; make_tokenizer_cases.py says how the reference is built).
//
// When to use
//   To turn text into the token ids a GGUF Llama-architecture model was trained with, to format chat
//   prompts for it (ChatML templates only, e.g. SmolLM2, Qwen2), and to build a RAG prompt whose passages
//   are separately tokenized chunks, which is what a chunk KV cache (CacheBlend, Epic, Cache-Craft) stores.
//   Not for SentencePiece ("llama"), WordPiece ("bert") or Unigram ("t5") vocabularies.
//
// Defaults: encode() parses control-token text (parse_special = true) and never adds BOS/EOS itself;
// build_rag_prompt's layout is "Document: {passage}\n" per passage and "Question: {question}" (below).
// BPETokenizer is immutable after construction; encode/decode may run concurrently on one instance.
//
// Dependencies: PCRE2 8-bit (Debian libpcre2-dev; pkg-config module `libpcre2-8`), linked by kvfuse::cpu.

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/gguf.hpp"

namespace kvfuse {

// "No such token", as llama.cpp's LLAMA_TOKEN_NULL.
inline constexpr token_id kNoToken = -1;

// Token types as GGUF stores them in `tokenizer.ggml.token_type` (llama.cpp's llama_token_type).
enum class TokenType : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

// The tokenizer part of a GGUF file's metadata, as plain data.
struct TokenizerVocab {
  std::string model = "gpt2";             // tokenizer.ggml.model
  std::string pre;                        // tokenizer.ggml.pre
  std::vector<std::string> tokens;        // tokenizer.ggml.tokens: byte-encoded text of each id
  std::vector<std::int32_t> token_types;  // tokenizer.ggml.token_type (TokenType); empty: all normal
  std::vector<std::string> merges;        // tokenizer.ggml.merges: "left right", rank = index
  token_id bos = kNoToken;                // tokenizer.ggml.bos_token_id
  token_id eos = kNoToken;                // tokenizer.ggml.eos_token_id
  token_id unk = kNoToken;                // tokenizer.ggml.unknown_token_id
  token_id pad = kNoToken;                // tokenizer.ggml.padding_token_id
  bool add_bos = false;                   // tokenizer.ggml.add_bos_token
  bool add_eos = false;                   // tokenizer.ggml.add_eos_token
  std::string chat_template;              // tokenizer.chat_template (Jinja source)

  // Type of token `id` (normal when token_types is empty); throws for an id outside [0, tokens.size()).
  [[nodiscard]] TokenType type_of(token_id id) const {
    const std::size_t n = token_types.empty() ? tokens.size() : std::min(tokens.size(), token_types.size());
    detail::require(id >= 0 && static_cast<std::size_t>(id) < n, "tokenizer: token id {} is not in [0, {})", id, n);
    return token_types.empty() ? TokenType::normal : static_cast<TokenType>(token_types[static_cast<std::size_t>(id)]);
  }

  // Throws kvfuse::error naming the first bad field. Merges are checked by BPETokenizer, which indexes them.
  void validate() const;

  // Reads the keys listed above; the optional ones keep their defaults when absent.
  [[nodiscard]] static TokenizerVocab from_gguf(const GGUFFile& file);
};

struct ChatMessage {
  std::string role;
  std::string content;
};

// A chat template, recognised from its Jinja source rather than run: only ChatML
// ("<|im_start|>{role}\n{content}<|im_end|>\n" per message, "<|im_start|>assistant\n" as generation
// prompt) is supported; anything else throws kvfuse::error on construction. When the template injects a
// default system message if the first message is not a system one (SmolLM2's does), that text is taken from
// the template's first '<|im_start|>system\n...<|im_end|>' literal and injected the same way.
class ChatTemplate {
 public:
  explicit ChatTemplate(std::string_view source);

  [[nodiscard]] std::string format(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  // Empty when the template has none.
  [[nodiscard]] const std::string& default_system_prompt() const noexcept { return default_system_; }

 private:
  std::string default_system_;
};

namespace detail {

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

inline void require_utf8(std::string_view text, std::string_view what) {
  const std::size_t bad = utf8_invalid_offset(text);
  require(bad == text.size(), "tokenizer: {} is not valid UTF-8 at byte offset {} (byte 0x{:02x})", what, bad,
          bad < text.size() ? static_cast<unsigned char>(text[bad]) : 0u);
}

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

// The regexes and options of one llama.cpp pre-tokenizer type.
struct PreTokenizerSpec {
  std::vector<std::string_view> regexes;
  bool ignore_merges = false;  // a piece that is itself a token is emitted whole (llama.cpp, llama3 family)
};

// GPT-2's pattern, the one llama.cpp's unicode_regex_split_custom_gpt2 implements by hand.
inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// llama.cpp's LLAMA_VOCAB_PRE_TYPE_LLAMA3 regex: tokenizer.json's (?i:'s|...) spelled case by case.
inline constexpr std::string_view kLlama3Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

inline constexpr std::string_view kSupportedPreTokenizers =
    "default, gpt-2, smollm, starcoder, refact, llama3, llama-v3, llama-bpe";

[[nodiscard]] inline std::optional<PreTokenizerSpec> pre_tokenizer_spec(std::string_view name) {
  if (name == "smollm" || name == "starcoder" || name == "refact")
    return PreTokenizerSpec{{R"(\p{N})", kGpt2Regex}, false};
  if (name == "gpt-2") return PreTokenizerSpec{{kGpt2Regex}, false};
  if (name == "llama3" || name == "llama-v3" || name == "llama-bpe") return PreTokenizerSpec{{kLlama3Regex}, true};
  if (name == "default") {
    return PreTokenizerSpec{{R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"}, false};
  }
  return std::nullopt;
}

}  // namespace detail

inline void TokenizerVocab::validate() const {
  detail::require(model == "gpt2", "tokenizer: unsupported tokenizer model '{}' (supported: gpt2)", model);
  detail::require(!pre.empty(), "tokenizer: the vocabulary names no pre-tokenizer (tokenizer.ggml.pre); supported: {}",
                  detail::kSupportedPreTokenizers);
  detail::require(detail::pre_tokenizer_spec(pre).has_value(),
                  "tokenizer: unsupported pre-tokenizer '{}' (supported: {})", pre, detail::kSupportedPreTokenizers);
  detail::require(!tokens.empty(), "tokenizer: the vocabulary has no tokens");
  detail::require(tokens.size() <= static_cast<std::size_t>(INT32_MAX), "tokenizer: {} tokens do not fit token_id",
                  tokens.size());
  detail::require(token_types.empty() || token_types.size() == tokens.size(), "tokenizer: {} token types for {} tokens",
                  token_types.size(), tokens.size());
  for (std::size_t i = 0; i < token_types.size(); ++i) {
    detail::require(token_types[i] >= 0 && token_types[i] <= 6, "tokenizer: token {} has unknown token type {}", i,
                    token_types[i]);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    detail::require_utf8(tokens[i], fmt::format("token {}", i));
  }
  const auto n = static_cast<token_id>(tokens.size());
  const std::pair<const char*, token_id> ids[] = {{"bos", bos}, {"eos", eos}, {"unk", unk}, {"pad", pad}};
  for (const auto& [name, id] : ids) {
    detail::require(id == kNoToken || (id >= 0 && id < n), "tokenizer: {} token id {} is not in [0, {})", name, id, n);
  }
  detail::require(!add_bos || bos != kNoToken, "tokenizer: add_bos is set but there is no bos token");
  detail::require(!add_eos || eos != kNoToken, "tokenizer: add_eos is set but there is no eos token");
}

// ------------------------------------------------------------------------------------------ ChatTemplate

inline ChatTemplate::ChatTemplate(std::string_view source) {
  detail::require(source.find("<|im_start|>") != std::string_view::npos,
                  "tokenizer: unsupported chat template (only ChatML, '<|im_start|>role\\n...<|im_end|>', is "
                  "supported): '{}'",
                  source.substr(0, 120));
  // The default system message, when the template inserts one for a conversation without a system message.
  // Its literal may spell the newline as a real newline or as the Jinja escape "\n".
  if (source.find("!= 'system'") == std::string_view::npos && source.find("!= \"system\"") == std::string_view::npos) {
    return;
  }
  for (std::string_view newline : {std::string_view("\n"), std::string_view("\\n")}) {
    const std::string head = fmt::format("<|im_start|>system{}", newline);
    const std::size_t at = source.find(head);
    if (at == std::string_view::npos) continue;
    const std::size_t begin = at + head.size();
    const std::size_t end = source.find("<|im_end|>", begin);
    if (end == std::string_view::npos) continue;
    const std::string_view text = source.substr(begin, end - begin);
    // Only a plain literal counts; an expression such as '{{ messages[0].content }}' is not a default.
    if (text.find_first_of("{}'\"\\") != std::string_view::npos) continue;
    default_system_ = std::string(text);
    return;
  }
}

inline std::string ChatTemplate::format(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  std::string out;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    detail::require(!m.role.empty() && m.role.find('\n') == std::string::npos,
                    "tokenizer: chat message {} has role '{}'; a role must be non-empty and on one line", i, m.role);
    if (i == 0 && m.role != "system" && !default_system_.empty()) {
      out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
    }
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

// ------------------------------------------------------------------------------------------ BPETokenizer

class BPETokenizer {
 public:
  explicit BPETokenizer(TokenizerVocab vocab) : vocab_(std::move(vocab)) {
    vocab_.validate();
    const auto spec = *detail::pre_tokenizer_spec(vocab_.pre);
    for (std::string_view r : spec.regexes) regexes_.emplace_back(r);
    ignore_merges_ = spec.ignore_merges;
    index_tokens();
    index_merges();
  }

  // Token ids of `text` (UTF-8). With parse_special, the text of control tokens ("<|im_start|>") becomes
  // those tokens; without, it is tokenized as plain text. User-defined tokens are matched either way, as in
  // llama.cpp. Never adds BOS/EOS: see add_bos()/add_eos().
  [[nodiscard]] std::vector<token_id> encode(std::string_view text, bool parse_special = true) const {
    detail::require_utf8(text, "input text");
    std::vector<token_id> out;
    if (text.empty()) return out;
    const detail::Pcre2MatchData match = detail::make_match_data();
    std::vector<std::pair<std::size_t, std::size_t>> pieces;
    std::vector<std::pair<std::size_t, std::size_t>> next;
    for (const Fragment& f : partition_special(text, parse_special)) {
      if (f.token != kNoToken) {
        out.push_back(f.token);
        continue;
      }
      pieces.assign(1, {f.begin, f.end});
      for (const detail::Pcre2Regex& regex : regexes_) {
        next.clear();
        for (const auto& [b, e] : pieces) regex.split(text.substr(b, e - b), b, match.get(), next);
        pieces.swap(next);
      }
      for (const auto& [b, e] : pieces) merge_piece(text.substr(b, e - b), out);
    }
    return out;
  }

  // The bytes the tokens stand for, concatenated. Control and unknown tokens appear as their text when
  // render_special is true and are left out otherwise (llama.cpp's `special` flag). Throws on an id
  // outside the vocabulary.
  [[nodiscard]] std::string decode(std::span<const token_id> ids, bool render_special = true) const {
    std::string out;
    for (const token_id id : ids) {
      check_id(id, "decode");
      const TokenType type = vocab_.type_of(id);
      if (!render_special && (type == TokenType::control || type == TokenType::unknown)) continue;
      out += pieces_[static_cast<std::size_t>(id)];
    }
    return out;
  }

  // The token's text as the vocabulary stores it (byte-encoded: "Ġthe" for " the").
  [[nodiscard]] std::string_view token_text(token_id id) const {
    check_id(id, "token_text");
    return vocab_.tokens[static_cast<std::size_t>(id)];
  }

  // The bytes the token stands for (" the"); a control token's own text ("<|im_end|>").
  [[nodiscard]] std::string_view token_piece(token_id id) const {
    check_id(id, "token_piece");
    return pieces_[static_cast<std::size_t>(id)];
  }

  // The id whose vocabulary text is exactly `text`, or kNoToken.
  [[nodiscard]] token_id find_token(std::string_view text) const {
    const auto it = text_to_id_.find(std::string(text));
    return it == text_to_id_.end() ? kNoToken : it->second;
  }

  [[nodiscard]] TokenType token_type(token_id id) const {
    check_id(id, "token_type");
    return vocab_.type_of(id);
  }

  // True for tokens that end a generated turn: eos, and control tokens llama.cpp treats as end of
  // generation by their text ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", ...).
  [[nodiscard]] bool is_end_of_generation(token_id id) const {
    check_id(id, "is_end_of_generation");
    return eog_[static_cast<std::size_t>(id)];
  }

  [[nodiscard]] token_id bos() const noexcept { return vocab_.bos; }
  [[nodiscard]] token_id eos() const noexcept { return vocab_.eos; }
  [[nodiscard]] bool add_bos() const noexcept { return vocab_.add_bos; }
  [[nodiscard]] bool add_eos() const noexcept { return vocab_.add_eos; }
  [[nodiscard]] std::size_t vocab_size() const noexcept { return vocab_.tokens.size(); }
  [[nodiscard]] const std::string& pre_tokenizer() const noexcept { return vocab_.pre; }
  [[nodiscard]] const std::string& chat_template() const noexcept { return vocab_.chat_template; }

  // The messages in the vocabulary's chat template; throws kvfuse::error if the template is not ChatML.
  [[nodiscard]] std::string format_chat(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
    return ChatTemplate(vocab_.chat_template).format(messages, add_generation_prompt);
  }

 private:
  struct Fragment {
    std::size_t begin = 0;
    std::size_t end = 0;
    token_id token = kNoToken;  // kNoToken: raw text [begin, end)
  };

  struct Merge {
    int rank = 0;
    token_id result = kNoToken;
  };

  static std::uint64_t pair_key(token_id left, token_id right) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }

  static int hex_digit(char c) noexcept {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  }

  void check_id(token_id id, const char* what) const {
    detail::require(id >= 0 && static_cast<std::size_t>(id) < vocab_.tokens.size(),
                    "tokenizer: {}: token id {} is not in [0, {})", what, id, vocab_.tokens.size());
  }

  void index_tokens() {
    const std::size_t n = vocab_.tokens.size();
    text_to_id_.reserve(n);
    pieces_.resize(n);
    eog_.assign(n, false);
    static constexpr std::string_view eog_texts[] = {"<|im_end|>", "<|endoftext|>", "<|eot_id|>",      "<|eom_id|>",
                                                     "<|end|>",    "<end_of_turn>", "<|end_of_text|>", "<EOT>"};
    for (std::size_t i = 0; i < n; ++i) {
      const auto id = static_cast<token_id>(i);
      const std::string& text = vocab_.tokens[i];
      const auto [it, inserted] = text_to_id_.emplace(text, id);
      detail::require(inserted, "tokenizer: token text '{}' appears twice (ids {} and {})", text, it->second, id);
      const TokenType type = vocab_.type_of(id);
      switch (type) {
        case TokenType::normal:
          // A normal token outside the byte alphabet stands for its own UTF-8 text (as Hugging Face's GGUF
          // converter reads it); such a token can never come out of encode().
          pieces_[i] = detail::gpt2_byte_decode(text).value_or(text);
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
          detail::require(text.starts_with("<0x") && text.ends_with('>') && hi >= 0 && lo >= 0,
                          "tokenizer: byte token {} is '{}', not '<0xHH>'", i, text);
          pieces_[i] = std::string(1, static_cast<char>(hi * 16 + lo));
          break;
        }
        case TokenType::undefined:
        case TokenType::unused:
          break;  // stands for nothing, as in llama.cpp
      }
      const bool eog_text = std::find(std::begin(eog_texts), std::end(eog_texts), text) != std::end(eog_texts);
      eog_[i] = id == vocab_.eos || (eog_text && type == TokenType::control);
    }
    // Longest special text first, then lower id: the order llama.cpp cuts them out of the text in.
    std::stable_sort(special_.begin(), special_.end(), [&](token_id a, token_id b) {
      return vocab_.tokens[static_cast<std::size_t>(a)].size() > vocab_.tokens[static_cast<std::size_t>(b)].size();
    });
    const auto& bytes = detail::gpt2_byte_text();
    for (std::size_t b = 0; b < 256; ++b) byte_token_[b] = find_token(bytes[b]);
  }

  void index_merges() {
    merges_.reserve(vocab_.merges.size());
    for (std::size_t rank = 0; rank < vocab_.merges.size(); ++rank) {
      const std::string& m = vocab_.merges[rank];
      const std::size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
      detail::require(space != std::string::npos && space + 1 < m.size(),
                      "tokenizer: merge {} '{}' is not 'left right'", rank, m);
      const std::string left = m.substr(0, space);
      const std::string right = m.substr(space + 1);
      const token_id l = find_token(left);
      const token_id r = find_token(right);
      const token_id result = find_token(left + right);
      detail::require(l != kNoToken && r != kNoToken && result != kNoToken,
                      "tokenizer: merge {} '{}' names a token that is not in the vocabulary", rank, m);
      merges_.emplace(pair_key(l, r), Merge{static_cast<int>(rank), result});  // a repeated pair keeps its first rank
    }
  }

  // Cuts special tokens out of the text, longest first; for one token, left to right.
  [[nodiscard]] std::vector<Fragment> partition_special(std::string_view text, bool parse_special) const {
    std::vector<Fragment> frags{{0, text.size(), kNoToken}};
    std::vector<Fragment> next;
    for (token_id id : special_) {
      const TokenType type = vocab_.type_of(id);
      if (!parse_special && type != TokenType::user_defined) continue;
      const std::string& needle = vocab_.tokens[static_cast<std::size_t>(id)];
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

  // BPE over one pre-tokenized piece: start from one token per byte, then repeatedly merge the adjacent
  // pair with the lowest merge rank, the leftmost one among equal ranks (llama.cpp's llm_bigram_bpe order).
  void merge_piece(std::string_view piece, std::vector<token_id>& out) const {
    if (ignore_merges_) {
      std::string encoded;
      for (char c : piece) encoded += detail::gpt2_byte_text()[static_cast<unsigned char>(c)];
      if (const token_id whole = find_token(encoded); whole != kNoToken) {
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

  TokenizerVocab vocab_;
  std::vector<detail::Pcre2Regex> regexes_;
  bool ignore_merges_ = false;
  std::unordered_map<std::string, token_id> text_to_id_;
  std::unordered_map<std::uint64_t, Merge> merges_;
  std::vector<std::string> pieces_;
  std::vector<bool> eog_;
  std::vector<token_id> special_;
  std::array<token_id, 256> byte_token_{};
};

// ------------------------------------------------------------------------------------------ RAG prompt

// A tokenized RAG prompt and the token range of each of its segments, in order:
// segments[0] the system turn, segments[1..n] the passages, segments[n+1] the question and generation prompt.
struct RagPrompt {
  std::vector<token_id> tokens;
  std::vector<TokenRange> segments;

  // System prompt and passages as the reusable chunks (all marked cached), the last segment as the query.
  [[nodiscard]] PromptLayout layout() const {
    PromptLayout l;
    for (std::size_t i = 0; i + 1 < segments.size(); ++i) l.chunks.push_back({segments[i], true});
    l.query = segments.empty() ? TokenRange{} : segments.back();
    return l;
  }
};

// Builds the CacheBlend-style RAG prompt (system prompt, then the passages, then the question) in the
// tokenizer's ChatML template, as one system and one user turn plus the generation prompt:
//
//   [bos if add_bos] <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n      segment 0
//   Document: {passage 1, trimmed}\n                                                  segment 1
//   ...
//   Document: {passage n, trimmed}\n                                                  segment n
//   Question: {question}<|im_end|>\n<|im_start|>assistant\n                           segment n+1
//
// i.e. format_chat({{"system", system}, {"user", "Document: p1\n...Document: pn\nQuestion: q"}}, true).
// Each segment is tokenized on its own, so a passage's tokens do not depend on its neighbours or its index
// and its chunk KV can be stored once and reused in any order. The ChatML markers come in as token ids and
// the caller's text is tokenized with parse_special = false, so a passage cannot inject control tokens.
//
// Equal to tokenizing the whole string (when the text contains no control-token text): the first two
// boundaries sit at a control token or right after one; every other boundary is "\n" | "Document" or
// "\n" | "Question", where a single "\n" after a non-space ends every pre-token (it is its own pre-token
// under the GPT-2, smollm and llama3 regexes whether or not text follows) and BPE never merges across
// pre-tokens. Passages are trimmed of Unicode whitespace (\s) so that "\n" is never part of a longer
// whitespace run, and a passage that is empty after trimming is refused. The tests check the equality on
// MuSiQue passages against token ids from Hugging Face tokenizers.
[[nodiscard]] inline RagPrompt build_rag_prompt(const BPETokenizer& tok, std::string_view system,
                                                std::span<const std::string> passages, std::string_view question) {
  const ChatTemplate chat(tok.chat_template());  // refuses non-ChatML templates
  const token_id im_start = tok.find_token("<|im_start|>");
  const token_id im_end = tok.find_token("<|im_end|>");
  detail::require(
      im_start != kNoToken && tok.token_type(im_start) == TokenType::control && im_end != kNoToken &&
          tok.token_type(im_end) == TokenType::control,
      "tokenizer: ChatML template but '<|im_start|>' / '<|im_end|>' are not control tokens of the vocabulary");
  const detail::Pcre2Regex trim(R"((?s)\A\s*+(.*?)\s*+\z)");  // group 1: the text without surrounding \s

  RagPrompt p;
  auto append_text = [&](std::string_view text) {
    const auto ids = tok.encode(text, /*parse_special=*/false);
    p.tokens.insert(p.tokens.end(), ids.begin(), ids.end());
  };
  auto close_segment = [&] {
    const std::int64_t begin = p.segments.empty() ? 0 : p.segments.back().end;
    p.segments.push_back({begin, static_cast<std::int64_t>(p.tokens.size())});
  };

  if (tok.add_bos()) p.tokens.push_back(tok.bos());
  p.tokens.push_back(im_start);
  append_text(fmt::format("system\n{}", system));
  p.tokens.push_back(im_end);
  append_text("\n");
  p.tokens.push_back(im_start);
  append_text("user\n");
  close_segment();

  for (std::size_t i = 0; i < passages.size(); ++i) {
    const std::string& text = passages[i];
    detail::require_utf8(text, fmt::format("passage {}", i));
    const auto [b, e] = *trim.find_group(text, 1);  // the pattern matches every string
    const std::string_view body = std::string_view(text).substr(b, e - b);
    detail::require(!body.empty(), "tokenizer: passage {} is empty or only whitespace", i);
    append_text(fmt::format("Document: {}\n", body));
    close_segment();
  }

  append_text(fmt::format("Question: {}", question));
  p.tokens.push_back(im_end);
  append_text("\n");
  p.tokens.push_back(im_start);
  append_text("assistant\n");
  close_segment();
  return p;
}

// ------------------------------------------------------------------------------------------ GGUF

inline TokenizerVocab TokenizerVocab::from_gguf(const GGUFFile& file) {
  TokenizerVocab v;
  v.model = file.get_string("tokenizer.ggml.model");
  if (file.contains("tokenizer.ggml.pre")) v.pre = file.get_string("tokenizer.ggml.pre");
  v.tokens = file.get_string_array("tokenizer.ggml.tokens");
  if (file.contains("tokenizer.ggml.token_type")) {
    const auto types = file.get_i32_array("tokenizer.ggml.token_type");
    v.token_types.assign(types.begin(), types.end());
  }
  if (file.contains("tokenizer.ggml.merges")) v.merges = file.get_string_array("tokenizer.ggml.merges");
  auto id = [&](const char* key) {
    if (!file.contains(key)) return kNoToken;
    const std::int64_t value = file.get_i64(key);
    detail::require(value >= 0 && value <= INT32_MAX, "tokenizer: {} = {} is not a token id", key, value);
    return static_cast<token_id>(value);
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  v.pad = id("tokenizer.ggml.padding_token_id");
  v.add_bos = file.get_bool("tokenizer.ggml.add_bos_token", false);
  v.add_eos = file.get_bool("tokenizer.ggml.add_eos_token", false);
  if (file.contains("tokenizer.chat_template")) v.chat_template = file.get_string("tokenizer.chat_template");
  return v;
}

}  // namespace kvfuse
