// BPETokenizer (kvfuse::Tokenizer on byte-level BPE vocabularies), ChatTemplate and build_rag_prompt in ChatML.
//  - A hand-made vocabulary (3 control tokens, the 256 GPT-2 byte symbols, a few merges): every expected id
//    list below is worked out by hand from the merge ranks and the pre-tokenizer regexes.
//  - The real SmolLM2 vocabulary (skipped when the model is absent): exact ids against
//    tests/data/tokenizer_cases.txt, produced by Hugging Face tokenizers (tests/data/make_tokenizer_cases.py).
#include <doctest/doctest.h>

#include "../support/error_of.hpp"
#include <fmt/format.h>

#include "../support/case_file.hpp"
#include "../support/model_path.hpp"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kvfuse/model/gguf.hpp"
#include "kvfuse/model/tokenizer.hpp"
#include "kvfuse/harness/rag_prompt.hpp"

// Each unit test file lives in its own namespace: the files are compiled together (a unity build).
namespace unit_tokenizer {

using kvfuse::BPETokenizer;
using kvfuse::ChatMessage;
using kvfuse::ChatTemplate;
using kvfuse::token_id;
using kvfuse::TokenizerVocab;
using Ids = std::vector<token_id>;
using namespace std::string_literals;

namespace {

// SmolLM2-135M-Instruct's chat template, verbatim.
const std::string kSmolTemplate =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

// GPT-2's bytes_to_unicode, written out again here: printable Latin-1 bytes stay, the rest become
// U+0100, U+0101, ... in byte order.
std::string byte_symbol(unsigned b) {
  unsigned cp = b;
  const auto printable = [](unsigned x) {
    return (x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
  };
  if (!printable(b)) {
    cp = 256;
    for (unsigned x = 0; x < b; ++x) cp += printable(x) ? 0 : 1;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Ids 0..2: control tokens; 3 + b: the symbol of byte b; then the merged tokens.
constexpr token_id kEnd = 0, kImStart = 1, kImEnd = 2;
token_id B(unsigned char c) { return 3 + c; }
constexpr token_id kBC = 259, kAB = 260, kSpA = 261, kSpAB = 262, kABC = 263, kApS = 264, kEAcute = 265, kAA = 266,
                   k12 = 267, kSpSp = 268;

TokenizerVocab tiny_vocab(std::string pre = "smollm") {
  TokenizerVocab v;
  v.pre = std::move(pre);
  v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  v.token_types = {3, 3, 3};
  for (unsigned b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_symbol(b));
    v.token_types.push_back(1);
  }
  // "Ġ" (U+0120) is the symbol of ' ', "Ã©" the two bytes of 'é' (C3 A9).
  const std::string G = "\xC4\xA0";
  for (const std::string& t :
       {"bc"s, "ab"s, G + "a", G + "ab", "abc"s, "'s"s, "\xC3\x83\xC2\xA9"s, "aa"s, "12"s, G + G}) {
    v.tokens.push_back(t);
    v.token_types.push_back(1);
  }
  // Rank = position. "b c" outranks "a b", which outranks "Ġ a".
  v.merges = {"b c", "a b", G + " a", G + "a b", "a bc", "' s", "\xC3\x83 \xC2\xA9", "a a", "1 2", G + " " + G};
  v.bos = kEnd;
  v.eos = kImEnd;
  v.chat_template = kSmolTemplate;
  return v;
}

Ids bytes_of(std::string_view s) {
  Ids ids;
  for (char c : s) ids.push_back(B(static_cast<unsigned char>(c)));
  return ids;
}

using kvfuse_test::error_of;

}  // namespace

TEST_CASE("BPE merges follow merge rank, not left-to-right order") {
  const BPETokenizer tok(tiny_vocab());
  // a b c: "b c" (rank 0) before "a b" (rank 1), then "a bc" (rank 4).
  CHECK(tok.encode("abc") == Ids{kABC});
  CHECK(tok.encode("bcd") == Ids{kBC, B('d')});
  // Ġ a b: "a b" (rank 1) beats "Ġ a" (rank 2); no merge "Ġ ab" exists, so "Ġab" is never reached.
  CHECK(tok.encode(" ab") == Ids{B(' '), kAB});
  // Ġ a: "Ġ a" applies; then "Ġa b" needs a b that is not there.
  CHECK(tok.encode(" a") == Ids{kSpA});
  CHECK(tok.encode(" ac") == Ids{kSpA, B('c')});
  // pieces "ab" and " ab" (the space joins the letters after it)
  CHECK(tok.encode("ab ab") == Ids{kAB, B(' '), kAB});
  // unmerged bytes stay byte tokens
  CHECK(tok.encode("xyz") == Ids{B('x'), B('y'), B('z')});
  CHECK(tok.encode("").empty());
}

TEST_CASE("BPE ties between equal ranks go to the leftmost pair") {
  const BPETokenizer tok(tiny_vocab());
  CHECK(tok.encode("aaa") == Ids{kAA, B('a')});  // (a a)@0 before (a a)@1
  CHECK(tok.encode("aaaa") == Ids{kAA, kAA});    // @0, then @2
  CHECK(tok.encode("aaaaa") == Ids{kAA, kAA, B('a')});
}

TEST_CASE("Byte-level encoding: a two-byte character merges from its byte symbols") {
  const BPETokenizer tok(tiny_vocab());
  CHECK(tok.encode("\xC3\xA9") == Ids{kEAcute});                        // é = C3 A9 -> "Ã" "©" -> "Ã©"
  CHECK(tok.encode("\xE2\x82\xAC") == Ids{B(0xE2), B(0x82), B(0xAC)});  // € has no merges
  CHECK(tok.token_piece(kEAcute) == "\xC3\xA9");
  CHECK(tok.token_text(B(' ')) == "\xC4\xA0");
  CHECK(tok.token_piece(B(' ')) == " ");
  CHECK(tok.token_piece(B('\n')) == "\n");
}

TEST_CASE("smollm pre-tokenizer: digits one by one, contractions, whitespace runs") {
  const BPETokenizer tok(tiny_vocab("smollm"));
  CHECK(tok.encode("12") == Ids{B('1'), B('2')});  // \p{N} isolates each digit: no "1 2" merge
  CHECK(tok.encode("a's") == Ids{B('a'), kApS});   // 's is its own piece
  // "a" "␠" "␠b": \s+(?!\S) leaves the last space to the word, so the two spaces are separate pieces and
  // "Ġ Ġ" cannot merge them; a trailing run is one piece and merges (leftmost pair first).
  CHECK(tok.encode("a  b") == Ids{B('a'), B(' '), B(' '), B('b')});
  CHECK(tok.encode("a   ") == Ids{B('a'), kSpSp, B(' ')});
  CHECK(tok.encode("a   b") == Ids{B('a'), kSpSp, B(' '), B('b')});
  CHECK(tok.encode("a\nb") == Ids{B('a'), B('\n'), B('b')});
  CHECK(tok.encode("a\n\n b") == Ids{B('a'), B('\n'), B('\n'), B(' '), B('b')});
}

TEST_CASE("gpt-2 pre-tokenizer keeps digit runs together, llama3 merges whole-token pieces directly") {
  const BPETokenizer gpt2(tiny_vocab("gpt-2"));
  CHECK(gpt2.encode("12") == Ids{k12});
  CHECK(gpt2.encode("x12") == Ids{B('x'), k12});  // letters and digits are separate pieces
  const BPETokenizer llama3(tiny_vocab("llama3"));
  CHECK(llama3.encode("12") == Ids{k12});              // \p{N}{1,3}
  CHECK(llama3.encode("'S") == Ids{B('\''), B('S')});  // one piece, no merge for "' S"
  CHECK(llama3.encode("a's") == Ids{B('a'), kApS});
  // ignore_merges: "Ġab" is a token, so the piece " ab" is emitted whole although BPE would give Ġ, ab.
  CHECK(llama3.encode(" ab") == Ids{kSpAB});
  const BPETokenizer deflt(tiny_vocab("default"));
  CHECK(deflt.encode("ab, ab") == Ids{kAB, B(','), B(' '), kAB});  // \p{P} runs first, then GPT-2
}

TEST_CASE("Control tokens are cut out of the text only with parse_special") {
  const BPETokenizer tok(tiny_vocab());
  CHECK(tok.encode("<|im_start|>ab<|im_end|>") == Ids{kImStart, kAB, kImEnd});
  CHECK(tok.encode("<|im_start|><|im_end|>") == Ids{kImStart, kImEnd});
  CHECK(tok.encode("x<|endoftext|>") == Ids{B('x'), kEnd});
  // parse_special = false: the same text as plain bytes ("<|" is one punctuation piece, "im" letters, ...)
  CHECK(tok.encode("<|im_end|>", false) == bytes_of("<|im_end|>"));
  CHECK(tok.encode("<|im_start", true) == bytes_of("<|im_start"));  // incomplete: no match
}

TEST_CASE("User-defined tokens are matched even without parse_special") {
  TokenizerVocab v = tiny_vocab();
  v.tokens.push_back("<tool>");
  v.token_types.push_back(4);
  const auto tool = static_cast<token_id>(v.tokens.size() - 1);
  const BPETokenizer tok(v);
  CHECK(tok.encode("a<tool>", false) == Ids{B('a'), tool});
  CHECK(tok.encode("a<tool>", true) == Ids{B('a'), tool});
}

TEST_CASE("decode inverts encode; control tokens can be left out") {
  const BPETokenizer tok(tiny_vocab());
  for (const char* s : {"abc", " ab ab", "aaa\n\n b", "\xC3\xA9t\xC3\xA9 12", "<|im_start|>x<|im_end|>\n", ""}) {
    CHECK(tok.decode(tok.encode(s)) == s);
  }
  const Ids ids{kImStart, kAB, kImEnd};
  CHECK(tok.decode(ids) == "<|im_start|>ab<|im_end|>");
  CHECK(tok.decode(ids, /*render_special=*/false) == "ab");
  const Ids bad{5, 9999};
  CHECK(error_of([&] { (void)tok.decode(bad); }).find("token id 9999") != std::string::npos);
  CHECK_THROWS_AS((void)tok.token_text(-1), kvfuse::error);
}

TEST_CASE("Byte tokens '<0xHH>' decode to their byte; a malformed one is refused") {
  TokenizerVocab v = tiny_vocab();
  v.tokens.push_back("<0x41>");
  v.token_types.push_back(6);
  const auto byte_a = static_cast<token_id>(v.tokens.size() - 1);
  CHECK(BPETokenizer(v).token_piece(byte_a) == "A");
  v.tokens.back() = "<0xZ1>";
  CHECK(error_of([&] { BPETokenizer t(v); }).find("byte token 269 is '<0xZ1>'") != std::string::npos);
}

TEST_CASE("Invalid UTF-8 input throws kvfuse::error naming the byte offset") {
  const BPETokenizer tok(tiny_vocab());
  CHECK(error_of([&] { (void)tok.encode("ab\xFF"); }).find("byte offset 2 (byte 0xff)") != std::string::npos);
  CHECK(error_of([&] { (void)tok.encode("a\xC3"); }).find("byte offset 1") != std::string::npos);          // truncated
  CHECK(error_of([&] { (void)tok.encode("\xC0\x80"); }).find("byte offset 0") != std::string::npos);       // overlong
  CHECK(error_of([&] { (void)tok.encode("x\xED\xA0\x80"); }).find("byte offset 1") != std::string::npos);  // surrogate
  CHECK(error_of([&] { (void)tok.encode("\xF4\x90\x80\x80"); }).find("byte offset 0") !=
        std::string::npos);                             // > U+10FFFF
  CHECK_NOTHROW((void)tok.encode("\xF0\x9F\x98\x80"));  // U+1F600 is fine
}

TEST_CASE("A byte without a token is dropped and blocks merges across it, as in llama.cpp") {
  TokenizerVocab v;
  v.pre = "gpt-2";
  v.tokens = {"a", "b", "ab"};
  v.merges = {"a b"};
  const BPETokenizer tok(v);
  CHECK(tok.encode("ab") == Ids{2});
  CHECK(tok.encode("azb") == Ids{0, 1});  // 'z' has no token: dropped, and "a b" does not merge over it
  CHECK(tok.encode("z").empty());
}

TEST_CASE("Bad vocabularies are refused with the bad value named") {
  auto message = [](TokenizerVocab v) { return error_of([&] { BPETokenizer t(std::move(v)); }); };
  TokenizerVocab v = tiny_vocab();
  v.model = "bert";
  CHECK(error_of([&] { kvfuse::Tokenizer t(v); }).find("unsupported tokenizer model 'bert'") != std::string::npos);
  v.model = "llama";  // a valid SentencePiece vocabulary for Tokenizer, but not byte-level BPE
  CHECK_NOTHROW(kvfuse::Tokenizer{v});
  CHECK(message(v).find("BPETokenizer takes byte-level BPE vocabularies ('gpt2'), not 'llama'") != std::string::npos);
  v = tiny_vocab("xyz");
  CHECK(message(v).find("unsupported pre-tokenizer 'xyz'") != std::string::npos);
  v = tiny_vocab("");
  CHECK(message(v).find("names no pre-tokenizer") != std::string::npos);
  v = tiny_vocab();
  v.merges.push_back("a zz");
  CHECK(message(v).find("merge 10 'a zz'") != std::string::npos);
  v = tiny_vocab();
  v.merges.push_back("abc");
  CHECK(message(v).find("merge 10 'abc' is not 'left right'") != std::string::npos);
  v = tiny_vocab();
  v.token_types.pop_back();
  CHECK(message(v).find("268 token types for 269 tokens") != std::string::npos);
  v = tiny_vocab();
  v.token_types[5] = 9;
  CHECK(message(v).find("token 5 has unknown token type 9") != std::string::npos);
  v = tiny_vocab();
  v.tokens.push_back("ab");
  v.token_types.push_back(1);
  CHECK(message(v).find("'ab' appears twice (ids 260 and 269)") != std::string::npos);
  v = tiny_vocab();
  v.eos = 269;
  CHECK(message(v).find("eos token id 269 is not in [0, 269)") != std::string::npos);
  v = tiny_vocab();
  v.bos = kvfuse::kNoToken;
  v.add_bos = true;
  CHECK(message(v).find("add_bos") != std::string::npos);
  v = tiny_vocab();
  v.tokens[4] = "\xFF";
  CHECK(message(v).find("token 4 is not valid UTF-8") != std::string::npos);
}

TEST_CASE("ChatML template: messages, the default system prompt, the generation prompt") {
  const ChatTemplate chat(kSmolTemplate);
  CHECK(chat.default_system_prompt() == "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  const std::vector<ChatMessage> with_system{{"system", "S."}, {"user", "Q?"}};
  CHECK(chat.format(with_system, true) ==
        "<|im_start|>system\nS.<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(chat.format(with_system, false) == "<|im_start|>system\nS.<|im_end|>\n<|im_start|>user\nQ?<|im_end|>\n");
  const std::vector<ChatMessage> user_only{{"user", "Hi"}};
  CHECK(chat.format(user_only, false) ==
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n");
  CHECK(chat.format({}, true) == "<|im_start|>assistant\n");
  // A plain ChatML template (Qwen-style escapes, no default) injects nothing.
  const ChatTemplate plain(
      "{% for m in messages %}{{'<|im_start|>' + m['role'] + '\\n' + m['content'] + "
      "'<|im_end|>\\n'}}{% endfor %}");
  CHECK(plain.default_system_prompt().empty());
  CHECK(plain.format(user_only, false) == "<|im_start|>user\nHi<|im_end|>\n");

  const std::vector<ChatMessage> bad_role{{"", "x"}};
  CHECK(error_of([&] { (void)chat.format(bad_role, true); }).find("chat message 0 has role ''") != std::string::npos);
  const std::string llama3 = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}";
  CHECK(error_of([&] { ChatTemplate t(llama3); }).find("unsupported chat template") != std::string::npos);
  TokenizerVocab v = tiny_vocab();
  v.chat_template = llama3;
  const BPETokenizer tok(v);
  CHECK_THROWS_AS((void)tok.format_chat(user_only, true), kvfuse::error);
}

TEST_CASE("RAG prompt: segments tile the prompt and equal the whole prompt tokenized at once") {
  const BPETokenizer tok(tiny_vocab());
  const std::vector<std::string> passages{"ab", "  abc \n", "a\nb 12"};
  const auto p = kvfuse::build_rag_prompt(tok, "Be brief.", passages, "ab?");
  REQUIRE(p.segments.size() == 5);
  CHECK(p.segments.front().begin == 0);
  CHECK(p.segments.back().end == static_cast<std::int64_t>(p.tokens.size()));
  for (std::size_t i = 1; i < p.segments.size(); ++i) CHECK(p.segments[i].begin == p.segments[i - 1].end);
  auto segment = [&](std::size_t i) {
    return Ids(p.tokens.begin() + p.segments[i].begin, p.tokens.begin() + p.segments[i].end);
  };
  // The layout documented in tokenizer.hpp, written out: passages trimmed, one "Document: " line each.
  CHECK(segment(0) == tok.encode("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"));
  CHECK(segment(1) == tok.encode("Document: ab\n"));
  CHECK(segment(2) == tok.encode("Document: abc\n"));
  CHECK(segment(3) == tok.encode("Document: a\nb 12\n"));
  CHECK(segment(4) == tok.encode("Question: ab?<|im_end|>\n<|im_start|>assistant\n"));
  const std::vector<ChatMessage> chat{{"system", "Be brief."},
                                      {"user", "Document: ab\nDocument: abc\nDocument: a\nb 12\nQuestion: ab?"}};
  CHECK(p.tokens == tok.encode(tok.format_chat(chat, true)));
  CHECK(p.tokens.front() == kImStart);

  const kvfuse::PromptLayout layout = p.layout();
  CHECK_NOTHROW(layout.validate());
  CHECK(layout.chunks.size() == 4);
  CHECK(layout.query == p.segments.back());
  CHECK(layout.chunk_context == 0);
  CHECK(layout.chunks.front().cached);
  // With the system turn as the chunk context: the same chunks, the system turn computed, the passages behind it.
  const kvfuse::PromptLayout behind = p.layout(/*system_context=*/true);
  CHECK_NOTHROW(behind.validate());
  CHECK(behind.chunk_context == p.segments.front().end);
  REQUIRE(behind.chunks.size() == 4);
  CHECK(!behind.chunks.front().cached);
  for (std::size_t i = 1; i < behind.chunks.size(); ++i) CHECK(behind.chunks[i].cached);
  CHECK(behind.query == layout.query);

  // A passage's tokens do not depend on its position: reordering moves the same segment.
  const std::vector<std::string> reordered{"a\nb 12", "ab", "  abc \n"};
  const auto q = kvfuse::build_rag_prompt(tok, "Be brief.", reordered, "ab?");
  CHECK(Ids(q.tokens.begin() + q.segments[1].begin, q.tokens.begin() + q.segments[1].end) == segment(3));
}

TEST_CASE("RAG prompt: bos when the vocabulary asks for it, control text in passages stays text, bad input") {
  TokenizerVocab v = tiny_vocab();
  v.add_bos = true;
  const BPETokenizer tok(v);
  const std::vector<std::string> passages{"<|im_end|>"};
  const auto p = kvfuse::build_rag_prompt(tok, "", passages, "");
  CHECK(p.tokens[0] == kEnd);  // bos = <|endoftext|> in the tiny vocabulary
  CHECK(p.tokens[1] == kImStart);
  CHECK(p.segments[0].begin == 0);
  const Ids passage(p.tokens.begin() + p.segments[1].begin, p.tokens.begin() + p.segments[1].end);
  CHECK(passage == tok.encode("Document: <|im_end|>\n", /*parse_special=*/false));

  const std::vector<std::string> blank{"ab", " \n\t "};
  CHECK(error_of([&] { (void)kvfuse::build_rag_prompt(tok, "", blank, "q"); }).find("passage 1 is empty") !=
        std::string::npos);
  const std::vector<std::string> invalid{"a\xFF"};
  CHECK(error_of([&] { (void)kvfuse::build_rag_prompt(tok, "", invalid, "q"); }).find("passage 0 is not valid UTF-8") !=
        std::string::npos);
  TokenizerVocab other = tiny_vocab();
  other.chat_template = "{{ messages }}";
  const BPETokenizer no_chatml(other);
  CHECK(error_of([&] {
          (void)kvfuse::build_rag_prompt(no_chatml, "", blank, "q");
        }).find("unsupported chat template") != std::string::npos);
}

// ------------------------------------------------------------------------------------ real vocabulary

using kvfuse_test::parse_ids;
using kvfuse_test::split_tabs;
using kvfuse_test::unescape;

TEST_CASE("real model: SmolLM2 vocabulary: exact ids of Hugging Face tokenizers on tricky text, chats and a RAG prompt") {
  const auto path = kvfuse_test::real_model(/*optimized_only=*/false);
  if (!path) return;
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(*path);
  const TokenizerVocab vocab = TokenizerVocab::from_gguf(file);
  if (vocab.pre != "smollm" || vocab.tokens.size() != 49152 || vocab.tokens[1] != "<|im_start|>") {
    kvfuse_test::skip(fmt::format("{} does not hold SmolLM2's tokenizer (pre '{}', {} tokens)", path->string(),
                                  vocab.pre, vocab.tokens.size()));
    return;
  }
  CHECK(vocab.model == "gpt2");
  CHECK(vocab.bos == 1);
  CHECK(vocab.eos == 2);
  CHECK_FALSE(vocab.add_bos);
  CHECK(vocab.merges.size() == 48900);

  std::map<std::string, BPETokenizer> by_pre;
  auto tokenizer = [&](const std::string& pre) -> const BPETokenizer& {
    auto it = by_pre.find(pre);
    if (it == by_pre.end()) {
      TokenizerVocab v = vocab;
      v.pre = pre;
      it = by_pre.emplace(pre, BPETokenizer(std::move(v))).first;
    }
    return it->second;
  };
  const BPETokenizer& smol = tokenizer("smollm");
  CHECK(smol.vocab_size() == 49152);
  CHECK(smol.is_end_of_generation(2));  // <|im_end|>
  CHECK(smol.is_end_of_generation(0));  // <|endoftext|>
  CHECK(smol.is_end_of_generation(4));  // <reponame>: llama.cpp's fill-in-the-middle repository token
  CHECK_FALSE(smol.is_end_of_generation(1));

  const std::filesystem::path cases_path =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "data" / "tokenizer_cases.txt";
  std::ifstream cases(cases_path);
  REQUIRE_MESSAGE(cases.good(), "missing ", cases_path.string());
  int encodes = 0, chats = 0, rags = 0;
  std::size_t dropped_bytes = 0;
  std::string line;
  while (std::getline(cases, line)) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> f = split_tabs(line);
    if (f[0] == "encode") {
      REQUIRE(f.size() == 5);
      const std::string text = unescape(f[3]);
      const bool parse_special = f[2] == "1";
      const BPETokenizer& tok = tokenizer(f[1]);
      const Ids ids = tok.encode(text, parse_special);
      INFO("pre-tokenizer ", f[1], ", parse_special ", f[2], ", text '", f[3], "'");
      CHECK(ids == parse_ids(f[4]));
      std::string kept;  // the text without the bytes the vocabulary has no token for
      for (char c : text) {
        if (tok.find_token(byte_symbol(static_cast<unsigned char>(c))) != kvfuse::kNoToken) kept += c;
      }
      CHECK(tok.decode(ids) == kept);
      dropped_bytes += text.size() - kept.size();
      ++encodes;
    } else if (f[0] == "chat") {
      REQUIRE(f.size() >= 4);
      REQUIRE(f.size() % 2 == 0);
      std::vector<ChatMessage> messages;
      for (std::size_t i = 4; i < f.size(); i += 2) messages.push_back({unescape(f[i]), unescape(f[i + 1])});
      const std::string rendered = smol.format_chat(messages, f[1] == "1");
      INFO("chat '", f[2], "'");
      CHECK(rendered == unescape(f[2]));
      CHECK(smol.encode(rendered) == parse_ids(f[3]));
      ++chats;
    } else if (f[0] == "rag") {
      REQUIRE(f.size() >= 4);
      std::vector<std::string> passages;
      for (std::size_t i = 4; i < f.size(); ++i) passages.push_back(unescape(f[i]));
      const auto p = kvfuse::build_rag_prompt(smol, unescape(f[2]), passages, unescape(f[3]));
      // Separately tokenized segments == the whole prompt tokenized by the reference.
      CHECK(p.tokens == parse_ids(f[1]));
      REQUIRE(p.segments.size() == passages.size() + 2);
      for (std::size_t i = 1; i < p.segments.size(); ++i) CHECK(p.segments[i].begin == p.segments[i - 1].end);
      CHECK(p.segments.back().end == static_cast<std::int64_t>(p.tokens.size()));
      const Ids first(p.tokens.begin() + p.segments[1].begin, p.tokens.begin() + p.segments[1].end);
      CHECK(smol.decode(first) == "Document: " + passages[0] + "\n");  // MuSiQue passages have no outer space
      ++rags;
    } else {
      FAIL("unknown record '", f[0], "' in ", cases_path.string());
    }
  }
  CHECK(encodes > 100);
  CHECK(dropped_bytes > 0);  // the cases include bytes SmolLM2 has no token for (U+0004, U+0014, plane 5)
  CHECK(chats >= 5);
  CHECK(rags == 1);
}

}  // namespace unit_tokenizer
