#pragma once
// BPETokenizer: the byte-level BPE tokenizer of a GGUF vocabulary (TokenizerVocab, model/vocab.hpp).
//
// What it does
//   BPETokenizer reproduces llama.cpp's tokenizer for `tokenizer.ggml.model = "gpt2"` (src/llama-vocab.cpp,
//   llm_tokenizer_bpe): (1) control / user-defined / unknown tokens are cut out of the raw text first,
//   longest token text first, as llama_vocab::impl::tokenizer_st_partition does; (2) every other piece is
//   split by the pre-tokenizer regexes the file names in `tokenizer.ggml.pre` (model/pretokenizer.hpp),
//   applied one after another with llama.cpp's "isolated" semantics (matches and the gaps between them both
//   become pieces); (3) each piece is byte-encoded with GPT-2's byte -> unicode map (model/byte_map.hpp) and
//   merged by BPE, lowest merge rank first and, among equal ranks, the leftmost pair first.
//   Unicode categories (\p{L}, \p{N}, \s) come from PCRE2 (PCRE2_UTF | PCRE2_UCP), not from tables here.
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
// Defaults: encode() parses control-token text (parse_special = true) and never adds BOS/EOS itself.
// BPETokenizer is immutable after construction; encode/decode may run concurrently on one instance.
//
// Dependencies: PCRE2 8-bit (Debian libpcre2-dev; pkg-config module `libpcre2-8`), linked by kvfuse::cpu.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <queue>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/byte_map.hpp"
#include "kvfuse/model/chat_template.hpp"
#include "kvfuse/model/pretokenizer.hpp"
#include "kvfuse/model/regex.hpp"
#include "kvfuse/model/utf8.hpp"
#include "kvfuse/model/vocab.hpp"

namespace kvfuse {

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

}  // namespace kvfuse
