// kvfuse::Tokenizer on SentencePiece vocabularies (tokenizer.ggml.model "llama", llama.cpp's
// llm_tokenizer_spm), and build_rag_prompt's plain layout for models without a chat template.
//  - A hand-made vocabulary (unk, bos, eos, a user-defined "\n", the 256 byte tokens, a few scored pieces):
//    every expected id list below is worked out by hand from the scores.
//  - The real Gemma 3 270M vocabulary (skipped when the model is absent): exact ids and text against
//    tests/data/spm_tokenizer_cases.txt, produced by llama.cpp itself (tests/data/make_spm_tokenizer_cases.py).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../support/case_file.hpp"
#include "../support/error_of.hpp"
#include "../support/model_path.hpp"
#include "kvfuse/model/gguf.hpp"
#include "kvfuse/model/tokenizer.hpp"
#include "kvfuse/harness/rag_prompt.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_tokenizer_spm {

using kvfuse::Tokenizer;
using kvfuse::token_id;
using kvfuse::TokenizerVocab;
using kvfuse_test::error_of;
using Ids = std::vector<token_id>;

namespace {

// Ids 0..3: <unk> (unknown), <s> (control, bos), </s> (control, eos), "\n" (user-defined);
// 4 + b: the byte token "<0xHH>" of byte b; then the scored pieces below.
constexpr token_id kUnk = 0, kBos = 1, kEos = 2, kNewline = 3;
token_id byte_id(unsigned char b) { return 4 + b; }
constexpr token_id kSpace = 260, kA = 261, kB = 262, kC = 263, kD = 264, kAB = 265, kBC = 266, kCD = 267, kABC = 268,
                   kAA = 269, kSpA = 270, kSpSp = 271, kEAcute = 272, kCA = 273;

const std::string kU2581 = "\xE2\x96\x81";  // "▁"

TokenizerVocab spm_vocab(bool add_space_prefix = false) {
  TokenizerVocab v;
  v.model = "llama";
  v.pre = "default";  // what Gemma 3's file says; SentencePiece uses no pre-tokenizer
  v.tokens = {"<unk>", "<s>", "</s>", "\n"};
  v.token_types = {2, 3, 3, 4};
  v.scores = {0, 0, 0, 0};
  for (unsigned b = 0; b < 256; ++b) {
    v.tokens.push_back(fmt::format("<0x{:02X}>", b));
    v.token_types.push_back(6);
    v.scores.push_back(0);
  }
  // Higher score merges first. "bc" and "cd" tie (-3); "ab" (-5) is below them, "ca" (-8) below "ab".
  const std::pair<std::string, float> pieces[] = {
      {kU2581, -1},  {"a", -2},           {"b", -2},    {"c", -2},        {"d", -2},
      {"ab", -5},    {"bc", -3},          {"cd", -3},   {"abc", -10},     {"aa", -4},
      {kU2581 + "a", -4}, {kU2581 + kU2581, -6}, {"\xC3\xA9", -3}, {"ca", -8}};
  for (const auto& [text, score] : pieces) {
    v.tokens.push_back(text);
    v.token_types.push_back(1);
    v.scores.push_back(score);
  }
  v.bos = kBos;
  v.eos = kEos;
  v.unk = kUnk;
  v.add_bos = true;
  v.add_space_prefix = add_space_prefix;
  return v;
}

}  // namespace

TEST_CASE("SPM merges the pair with the highest score first, not the leftmost") {
  const Tokenizer tok(spm_vocab());
  CHECK(tok.model() == "llama");
  // a b c: "bc" (-3) before "ab" (-5); then "a" + "bc" = "abc".
  CHECK(tok.encode("abc") == Ids{kABC});
  // c a b: "ab" (-5) beats "ca" (-8) although "ca" is further left.
  CHECK(tok.encode("cab") == Ids{kC, kAB});
  CHECK(tok.encode("ca") == Ids{kCA});
  CHECK(tok.encode("ab") == Ids{kAB});
  CHECK(tok.encode("").empty());
}

TEST_CASE("SPM ties between equal scores go to the leftmost pair") {
  const Tokenizer tok(spm_vocab());
  // b c d: "bc" and "cd" tie at -3: "bc" (left) merges, "cd" is gone.
  CHECK(tok.encode("bcd") == Ids{kBC, kD});
  // a b c d: "bc" first (tie with "cd", leftmost), then "abc"; the rightmost-first order would give ab, cd.
  CHECK(tok.encode("abcd") == Ids{kABC, kD});
  CHECK(tok.encode("aaa") == Ids{kAA, kA});
  CHECK(tok.encode("aaaa") == Ids{kAA, kAA});
  CHECK(tok.encode("aaaaa") == Ids{kAA, kAA, kA});
}

TEST_CASE("SPM spaces become U+2581 and merge like any character") {
  const Tokenizer tok(spm_vocab());
  CHECK(tok.encode(" a") == Ids{kSpA});
  CHECK(tok.encode("a b") == Ids{kA, kSpace, kB});  // no "▁b" piece
  // ▁ ▁ a: "▁a" (-4) beats "▁▁" (-6).
  CHECK(tok.encode("  a") == Ids{kSpace, kSpA});
  CHECK(tok.encode("  ") == Ids{kSpSp});
  CHECK(tok.encode(kU2581 + "a") == Ids{kSpA});  // a literal U+2581 in the text is the same character
  CHECK(tok.token_text(kSpA) == kU2581 + "a");
  CHECK(tok.token_piece(kSpA) == " a");
}

TEST_CASE("SPM byte fallback: a character that is no token becomes its <0xHH> byte tokens") {
  const Tokenizer tok(spm_vocab());
  CHECK(tok.encode("x") == Ids{byte_id('x')});
  CHECK(tok.encode("axb") == Ids{kA, byte_id('x'), kB});
  CHECK(tok.encode("\xE2\x82\xAC") == Ids{byte_id(0xE2), byte_id(0x82), byte_id(0xAC)});  // € has no piece
  CHECK(tok.encode("\xC3\xA9") == Ids{kEAcute});                                          // é has one
  CHECK(tok.encode("\xF0\x9F\x98\x80") == Ids{byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80)});
  CHECK(tok.token_piece(byte_id(0xE2)) == "\xE2");
  CHECK(tok.decode(tok.encode("x\xE2\x82\xAC\xC3\xA9")) == "x\xE2\x82\xAC\xC3\xA9");
}

TEST_CASE("SPM without byte tokens: one unk per unknown character; without unk, an error naming it") {
  TokenizerVocab v = spm_vocab();
  for (unsigned b = 0; b < 256; ++b) {  // no "<0xHH>" texts any more, and no byte-type tokens
    const auto at = static_cast<std::size_t>(byte_id(static_cast<unsigned char>(b)));
    v.tokens[at] = fmt::format("[byte{}]", b);
    v.token_types[at] = 1;
  }
  const Tokenizer tok(v);
  CHECK(tok.encode("x") == Ids{kUnk});
  CHECK(tok.encode("ax\xE2\x82\xAC" "b") == Ids{kA, kUnk, kUnk, kB});
  CHECK(tok.decode(Ids{kA, kUnk}) == "a<unk>");
  CHECK(tok.decode(Ids{kA, kUnk}, /*render_special=*/false) == "a");
  v.unk = kvfuse::kNoToken;
  const Tokenizer no_unk(v);
  CHECK(error_of([&] { (void)no_unk.encode("ax"); }).find("'x' (in the text fragment at byte offset 0) is no token") !=
        std::string::npos);
}

TEST_CASE("SPM special tokens: control text only with parse_special, user-defined always") {
  const Tokenizer tok(spm_vocab());
  CHECK(tok.encode("a</s>b") == Ids{kA, kEos, kB});
  // Without parse_special "</s>" is text: '<', '/', 's', '>' are no pieces, so bytes.
  CHECK(tok.encode("a</s>", false) == Ids{kA, byte_id('<'), byte_id('/'), byte_id('s'), byte_id('>')});
  CHECK(tok.encode("a\nb", false) == Ids{kA, kNewline, kB});  // "\n" is user-defined
  CHECK(tok.encode("a\nb", true) == Ids{kA, kNewline, kB});
  // Pieces never merge across a special token: " " + "a" would be "▁a".
  CHECK(tok.encode(" \na") == Ids{kSpace, kNewline, kA});
  CHECK(tok.encode("<unk>", true) == Ids{kUnk});
  CHECK(tok.encode("<unk>", false) == Ids{byte_id('<'), byte_id('u'), byte_id('n'), byte_id('k'), byte_id('>')});
}

TEST_CASE("SPM space prefix: before the text and after each special token; decode drops the first one") {
  const Tokenizer tok(spm_vocab(/*add_space_prefix=*/true));
  CHECK(tok.add_space_prefix());
  CHECK(tok.encode("a") == Ids{kSpA});
  CHECK(tok.encode("a b") == Ids{kSpA, kSpace, kB});
  CHECK(tok.encode("<s>a") == Ids{kBos, kSpA});
  CHECK(tok.encode("a</s>a") == Ids{kSpA, kEos, kSpA});
  CHECK(tok.encode("a\na") == Ids{kSpA, kNewline, kSpA});  // a user-defined token counts as special here too
  CHECK(tok.encode("a</s>a", false) ==
        Ids{kSpA, byte_id('<'), byte_id('/'), byte_id('s'), byte_id('>'), kA});  // one fragment: one prefix
  CHECK(tok.decode(Ids{kSpA, kSpace, kB}) == "a b");                              // the prefix space is dropped
  CHECK(tok.decode(Ids{kBos, kSpA}) == "<s> a");          // only the first token's space, as llama.cpp
  CHECK(tok.decode(Ids{kBos, kSpA}, false) == " a");      // llama_detokenize: a skipped bos still counts
  CHECK(tok.decode(tok.encode("a b")) == "a b");
  const Tokenizer plain(spm_vocab(false));
  CHECK(plain.decode(Ids{kSpA, kSpace, kB}) == " a b");
}

TEST_CASE("SPM tokenize adds BOS / EOS as the vocabulary asks; decode renders control tokens on request") {
  TokenizerVocab v = spm_vocab();
  const Tokenizer tok(v);
  CHECK(tok.tokenize("ab", /*add_special=*/true) == Ids{kBos, kAB});
  CHECK(tok.tokenize("ab", /*add_special=*/false) == Ids{kAB});
  CHECK(tok.tokenize("", true) == Ids{kBos});
  v.add_eos = true;
  CHECK(Tokenizer(v).tokenize("ab", true) == Ids{kBos, kAB, kEos});
  CHECK(tok.decode(Ids{kBos, kAB, kNewline, kEos}) == "<s>ab\n</s>");
  CHECK(tok.decode(Ids{kBos, kAB, kNewline, kEos}, /*render_special=*/false) == "ab\n");
  CHECK(tok.is_end_of_generation(kEos));
  CHECK_FALSE(tok.is_end_of_generation(kBos));
  CHECK(tok.bos() == kBos);
  CHECK(tok.eos() == kEos);
  CHECK(tok.add_bos());
  CHECK(tok.chat_template().empty());
  CHECK(error_of([&] { (void)tok.encode("a\xFF"); }).find("byte offset 1") != std::string::npos);
  const Ids bad{kA, 9999};
  CHECK(error_of([&] { (void)tok.decode(bad); }).find("token id 9999") != std::string::npos);
}

TEST_CASE("SPM vocabularies are checked: scores per token, no NaN; merges and pre-tokenizer are not needed") {
  auto message = [](TokenizerVocab v) { return error_of([&] { Tokenizer t(std::move(v)); }); };
  TokenizerVocab v = spm_vocab();
  v.scores.pop_back();
  CHECK(message(v).find("273 scores for 274 tokens") != std::string::npos);
  v = spm_vocab();
  v.scores[kAB] = std::numeric_limits<float>::quiet_NaN();
  CHECK(message(v).find("token 265 has score NaN") != std::string::npos);
  v = spm_vocab();
  v.pre = "";
  v.scores.clear();  // no scores: all 0, so the leftmost pair merges first
  const Tokenizer unscored(v);
  CHECK(unscored.encode("cab") == Ids{kCA, kB});
}

TEST_CASE("Control-looking token texts are control tokens whatever the file says, as llama.cpp overrides them") {
  TokenizerVocab v = spm_vocab();
  for (const std::string text : {"<end_of_turn>", "<PRE>", "<reponame>"}) {
    v.tokens.push_back(text);
    v.token_types.push_back(4);  // user-defined in the file
    v.scores.push_back(0);
  }
  const token_id end_of_turn = 274, pre = 275, reponame = 276;
  const Tokenizer tok(v);
  CHECK(tok.token_type(end_of_turn) == kvfuse::TokenType::control);
  CHECK(tok.token_type(pre) == kvfuse::TokenType::control);
  CHECK(tok.is_end_of_generation(end_of_turn));
  CHECK(tok.is_end_of_generation(reponame));  // fill-in-the-middle repository token
  CHECK_FALSE(tok.is_end_of_generation(pre));
  CHECK(tok.encode("a<end_of_turn>", true) == Ids{kA, end_of_turn});
  CHECK(tok.encode("a<PRE>", false).size() == 6);  // text: a, then five bytes
  CHECK(tok.decode(Ids{kA, end_of_turn}, /*render_special=*/false) == "a");
}

// ------------------------------------------------------------------------------------ from a GGUF file

namespace {

// A GGUF v3 file with metadata only (no tensors).
class MetadataWriter {
 public:
  std::vector<std::byte> bytes;
  std::uint64_t count = 0;

  void string_key(std::string_view key, std::string_view value) {
    name(key, 8);
    str(value);
  }
  void bool_key(std::string_view key, bool value) {
    name(key, 7);
    bytes.push_back(std::byte{value ? std::uint8_t{1} : std::uint8_t{0}});
  }
  void u32_key(std::string_view key, std::uint32_t value) {
    name(key, 4);
    scalar(value);
  }
  void string_array(std::string_view key, const std::vector<std::string>& values) {
    name(key, 9);
    scalar(std::uint32_t{8});
    scalar(static_cast<std::uint64_t>(values.size()));
    for (const auto& s : values) str(s);
  }
  template <class T>
  void array(std::string_view key, std::uint32_t type, const std::vector<T>& values) {
    name(key, 9);
    scalar(type);
    scalar(static_cast<std::uint64_t>(values.size()));
    for (const T v : values) scalar(v);
  }
  [[nodiscard]] std::vector<std::byte> file() const {
    std::vector<std::byte> out;
    for (const char c : std::string_view("GGUF")) out.push_back(static_cast<std::byte>(c));
    auto put = [&out](auto v) {
      const auto u = std::bit_cast<std::conditional_t<sizeof(v) == 4, std::uint32_t, std::uint64_t>>(v);
      for (std::size_t i = 0; i < sizeof(v); ++i) out.push_back(static_cast<std::byte>((u >> (8 * i)) & 0xff));
    };
    put(std::uint32_t{3});
    put(std::uint64_t{0});
    put(count);
    out.insert(out.end(), bytes.begin(), bytes.end());
    return out;
  }

 private:
  template <class T>
  void scalar(T v) {
    const auto u = std::bit_cast<std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>(v);
    for (std::size_t i = 0; i < sizeof(T); ++i) bytes.push_back(static_cast<std::byte>((u >> (8 * i)) & 0xff));
  }
  void str(std::string_view s) {
    scalar(static_cast<std::uint64_t>(s.size()));
    for (const char c : s) bytes.push_back(static_cast<std::byte>(c));
  }
  void name(std::string_view key, std::uint32_t type) {
    ++count;
    str(key);
    scalar(type);
  }
};

}  // namespace

TEST_CASE("TokenizerVocab::from_gguf reads SentencePiece scores (float32 or int32) and llama.cpp's defaults") {
  const TokenizerVocab ref = spm_vocab();
  auto write = [&](bool int_scores, bool with_flags) {
    MetadataWriter w;
    w.string_key("tokenizer.ggml.model", "llama");
    w.string_array("tokenizer.ggml.tokens", ref.tokens);
    w.array("tokenizer.ggml.token_type", 5, ref.token_types);
    if (int_scores) {
      std::vector<std::int32_t> scores;
      for (const float s : ref.scores) scores.push_back(static_cast<std::int32_t>(s));
      w.array("tokenizer.ggml.scores", 5, scores);
    } else {
      w.array("tokenizer.ggml.scores", 6, ref.scores);
    }
    w.u32_key("tokenizer.ggml.bos_token_id", kBos);
    w.u32_key("tokenizer.ggml.eos_token_id", kEos);
    w.u32_key("tokenizer.ggml.unknown_token_id", kUnk);
    if (with_flags) {
      w.bool_key("tokenizer.ggml.add_bos_token", false);
      w.bool_key("tokenizer.ggml.add_space_prefix", false);
    }
    return w.file();
  };
  const std::vector<std::byte> with_flags = write(false, true);
  const TokenizerVocab v = TokenizerVocab::from_gguf(kvfuse::GGUFFile::parse(with_flags));
  CHECK(v.model == "llama");
  CHECK(v.scores == ref.scores);
  CHECK_FALSE(v.add_bos);
  CHECK_FALSE(v.add_space_prefix);
  CHECK(Tokenizer(v).encode("abcd") == Ids{kABC, kD});
  // Without the keys llama.cpp adds BOS and a space prefix to SentencePiece vocabularies.
  const std::vector<std::byte> defaults = write(true, false);
  const TokenizerVocab d = TokenizerVocab::from_gguf(kvfuse::GGUFFile::parse(defaults));
  CHECK(d.scores == ref.scores);  // the scores above are whole numbers
  CHECK(d.add_bos);
  CHECK(d.add_space_prefix);
  CHECK(Tokenizer(d).tokenize("a", true) == Ids{kBos, kSpA});
}

// ------------------------------------------------------------------------------------ RAG prompt, plain

TEST_CASE("RAG prompt without a chat template: plain text, bos first, segments equal the whole prompt") {
  const Tokenizer tok(spm_vocab());
  const std::vector<std::string> passages{"ab", "  cab \n", "a\nb x"};
  const auto p = kvfuse::build_rag_prompt(tok, " Be brief. ", passages, "ab?");
  REQUIRE(p.segments.size() == 5);
  auto segment = [&](std::size_t i) {
    return Ids(p.tokens.begin() + p.segments[i].begin, p.tokens.begin() + p.segments[i].end);
  };
  CHECK(p.tokens.front() == kBos);
  CHECK(segment(0) == tok.tokenize("Be brief.\n", true, false));
  CHECK(segment(1) == tok.encode("Document: ab\n", false));
  CHECK(segment(2) == tok.encode("Document: cab\n", false));
  CHECK(segment(3) == tok.encode("Document: a\nb x\n", false));
  CHECK(segment(4) == tok.encode("Question: ab?\nAnswer:", false));
  // "\n" is a user-defined token, so the whole string tokenizes to the same ids.
  CHECK(p.tokens ==
        tok.tokenize("Be brief.\nDocument: ab\nDocument: cab\nDocument: a\nb x\nQuestion: ab?\nAnswer:", true, false));
  CHECK(tok.decode(p.tokens, false) ==
        "Be brief.\nDocument: ab\nDocument: cab\nDocument: a\nb x\nQuestion: ab?\nAnswer:");
  const kvfuse::PromptLayout layout = p.layout();
  CHECK_NOTHROW(layout.validate());
  CHECK(layout.chunks.size() == 4);

  // An empty system prompt leaves segment 0 with the bos alone; control text in a passage stays text.
  const std::vector<std::string> control{"</s>"};
  const auto q = kvfuse::build_rag_prompt(tok, "", control, "q");
  CHECK(q.segments[0].end == 1);
  CHECK(Ids(q.tokens.begin() + q.segments[1].begin, q.tokens.begin() + q.segments[1].end) ==
        tok.encode("Document: </s>\n", false));
  const std::vector<std::string> blank{"ab", " \n\t "};
  CHECK(error_of([&] { (void)kvfuse::build_rag_prompt(tok, "", blank, "q"); }).find("passage 1 is empty") !=
        std::string::npos);
  CHECK(error_of([&] { (void)kvfuse::build_rag_prompt(tok, "\xFF", passages, "q"); }).find("system prompt") !=
        std::string::npos);
}

// ------------------------------------------------------------------------------------ real vocabulary

TEST_CASE("real model: Gemma 3 vocabulary: exact ids and text of llama.cpp on tricky text, MuSiQue and a RAG prompt") {
  const auto path = kvfuse_test::real_model(/*optimized_only=*/false, kvfuse_test::RealModel::gemma3);
  if (!path) return;
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(*path);
  const Tokenizer tok = Tokenizer::from_gguf(file);
  if (tok.model() != "llama" || tok.vocab_size() != 262144) {
    kvfuse_test::skip(fmt::format("{} does not hold Gemma 3's tokenizer (model '{}', {} tokens)", path->string(),
                                  tok.model(), tok.vocab_size()));
    return;
  }
  CHECK(tok.bos() == 2);
  CHECK(tok.eos() == 1);
  CHECK(tok.add_bos());
  CHECK_FALSE(tok.add_eos());
  CHECK_FALSE(tok.add_space_prefix());
  CHECK(tok.chat_template().empty());
  CHECK(tok.is_end_of_generation(1));    // <eos>
  CHECK(tok.is_end_of_generation(106));  // <end_of_turn>
  CHECK_FALSE(tok.is_end_of_generation(2));
  CHECK(tok.token_type(107) == kvfuse::TokenType::user_defined);  // "\n"
  CHECK(tok.token_type(212) == kvfuse::TokenType::control);       // "</s>": user-defined in the file

  const std::filesystem::path cases_path =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "spm_tokenizer_cases.txt";
  std::ifstream cases(cases_path);
  REQUIRE_MESSAGE(cases.good(), "missing ", cases_path.string());
  int encodes = 0, decodes = 0, rags = 0, eogs = 0, byte_fallbacks = 0;
  std::string line;
  while (std::getline(cases, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> f = kvfuse_test::split_tabs(line);
    if (f[0] == "encode") {
      REQUIRE(f.size() == 5);
      const std::string text = kvfuse_test::unescape(f[3]);
      const Ids ids = tok.tokenize(text, /*add_special=*/f[2] == "1", /*parse_special=*/f[1] == "1");
      INFO("parse_special ", f[1], ", add_bos ", f[2], ", text '", f[3], "'");
      CHECK(ids == kvfuse_test::parse_ids(f[4]));
      for (const token_id id : ids) byte_fallbacks += tok.token_type(id) == kvfuse::TokenType::byte ? 1 : 0;
      // Every byte comes back, but a U+2581 in the text, which comes back as a space.
      const Ids body(ids.begin() + (f[2] == "1" && !ids.empty() ? 1 : 0), ids.end());
      CHECK(tok.decode(body) == kvfuse::detail::replace_all(text, "\xE2\x96\x81", " "));
      ++encodes;
    } else if (f[0] == "decode") {
      REQUIRE(f.size() == 4);
      INFO("decode special ", f[1], ", ids ", f[2]);
      CHECK(tok.decode(kvfuse_test::parse_ids(f[2]), /*render_special=*/f[1] == "1") == kvfuse_test::unescape(f[3]));
      ++decodes;
    } else if (f[0] == "eog") {
      REQUIRE(f.size() == 2);
      Ids eog;
      for (token_id id = 0; id < static_cast<token_id>(tok.vocab_size()); ++id) {
        if (tok.is_end_of_generation(id)) eog.push_back(id);
      }
      CHECK(eog == kvfuse_test::parse_ids(f[1]));  // <eos>, <end_of_turn> and "</s>"
      ++eogs;
    } else if (f[0] == "rag") {
      REQUIRE(f.size() >= 4);
      std::vector<std::string> passages;
      for (std::size_t i = 4; i < f.size(); ++i) passages.push_back(kvfuse_test::unescape(f[i]));
      const auto p =
          kvfuse::build_rag_prompt(tok, kvfuse_test::unescape(f[2]), passages, kvfuse_test::unescape(f[3]));
      // Separately tokenized segments == the whole prompt tokenized by llama.cpp.
      CHECK(p.tokens == kvfuse_test::parse_ids(f[1]));
      REQUIRE(p.segments.size() == passages.size() + 2);
      for (std::size_t i = 1; i < p.segments.size(); ++i) CHECK(p.segments[i].begin == p.segments[i - 1].end);
      CHECK(p.segments.back().end == static_cast<std::int64_t>(p.tokens.size()));
      CHECK(p.tokens.front() == tok.bos());
      ++rags;
    } else {
      FAIL("unknown record '", f[0], "' in ", cases_path.string());
    }
  }
  CHECK(encodes > 100);
  CHECK(decodes >= 20);
  CHECK(rags == 2);
  CHECK(eogs == 1);
  CHECK(byte_fallbacks > 0);  // the cases include characters Gemma 3 has no token for
}

}  // namespace unit_tokenizer_spm
