// kvfuse-server's pieces without HTTP: request checks name the field; a prompt's parts are chunks whose tokens do not
// depend on their neighbours or position; streamed text never splits a UTF-8 sequence or a stop sequence;
// --method auto reads the calibrations of its own chunk context only; a client that closed its connection is seen.
#include <doctest/doctest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_request.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/model/gguf.hpp"
#include "peer_connection.hpp"
#include "server_method.hpp"
#include "text_stream.hpp"

#include "../support/model_path.hpp"
#include "../support/test_util.hpp"

using kvfuse_server::ApiError;
using nlohmann::json;

namespace {

std::string param_of(const json& body) {
  try {
    (void)kvfuse_server::parse_chat_request(body);
  } catch (const ApiError& e) {
    CHECK(e.status() == 400);
    const json param = e.body()["error"]["param"];
    return param.is_null() ? std::string() : param.get<std::string>();
  }
  return "(accepted)";
}

json user_parts(const std::vector<std::string>& texts) {
  json content = json::array();
  for (const std::string& t : texts) content.push_back({{"type", "text"}, {"text", t}});
  return {{"messages", json::array({{{"role", "user"}, {"content", content}}})}};
}

// Whether `s` is valid UTF-8 (complete sequences only).
bool valid_utf8(const std::string& s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

TEST_CASE("server: a bad field is refused by name") {
  json ok = user_parts({"a part", "a question"});
  CHECK(param_of(ok) == "(accepted)");
  const auto with = [&](const char* key, json value) {
    json b = ok;
    b[key] = std::move(value);
    return param_of(b);
  };
  CHECK(with("max_tokens", 0) == "max_tokens");
  CHECK(with("max_tokens", 1.5) == "max_tokens");
  CHECK(with("max_completion_tokens", -3) == "max_completion_tokens");
  CHECK(with("temperature", "hot") == "temperature");
  CHECK(with("temperature", 2.5) == "temperature");
  CHECK(with("seed", "x") == "seed");
  CHECK(with("stop", json::array({"a", 1})) == "stop");
  CHECK(with("stop", json::array({"a", "b", "c", "d", "e"})) == "stop");
  CHECK(with("stream", "yes") == "stream");
  CHECK(with("n", 3) == "n");
  CHECK(with("kvfuse", json{{"method", 5}}) == "kvfuse.method");
  CHECK(with("messages", json::array()) == "messages");
  CHECK(with("messages", json::array({{{"role", "user"}}})) == "messages[0].content");
  CHECK(with("messages", json::array({{{"role", "tool"}, {"content", "x"}}})) == "messages[0].role");
  CHECK(with("messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "text"}}})}}})) ==
        "messages[0].content[0].text");
  CHECK(param_of(json::array()) == "");
  CHECK(param_of(json{{"model", "m"}}) == "messages");
}

TEST_CASE("server: --method auto takes the calibrations of its own chunk context, never another's") {
  const kvfuse_test::TempDir dir;
  constexpr std::uint64_t kModel = 0xabc;
  const auto save = [&](const std::string& family, const std::string& chosen, double recomputed,
                        std::string_view context, std::uint64_t samples) {
    kvfuse::Calibration c;
    c.model_fingerprint = kModel;
    c.family = family;
    c.naive = {0.0, 0.1, 0.8};
    c.points.push_back({chosen, {recomputed, 0.01, 0.99}, true});
    c.chosen = chosen;
    kvfuse::eval::save_calibration(kvfuse::eval::calibration_file(dir.path, kModel, family, {}, samples), c, samples,
                                   context);
  };
  save("cacheblend", "cacheblend@0.05", 0.05, "none", 1);
  save("cacheblend", "cacheblend@0.3", 0.3, "system", 2);
  save("attnlink", "attnlink@16", 0.2, "system", 3);
  const auto chosen = [&](std::uint64_t model, std::string_view engine, std::string_view context, std::string& why) {
    return kvfuse::method_name(kvfuse_server::auto_method(dir.path, model, engine, context, why));
  };
  const auto name = [](std::string_view m) { return kvfuse::method_name(kvfuse::parse_method(m)); };
  std::string why;
  // Behind the system turn: AttnLink recomputes less than CacheBlend at 0.3; the calibration of caches computed
  // alone (CacheBlend at 0.05, cheaper still) is not read.
  CHECK(chosen(kModel, "cpu", "system", why) == name("attnlink@16"));
  CHECK(why.find("calibrated") != std::string::npos);
  CHECK(why.find("cacheblend") != std::string::npos);
  CHECK(chosen(kModel, "cpu", "none", why) == name("cacheblend@0.05"));
  // llama.cpp considers AttnLink only, which was calibrated behind the system turn only: Epic's default.
  CHECK(chosen(kModel, "llamacpp", "none", why) == name("attnlink"));
  CHECK(why.find("chunk context 'none'") != std::string::npos);
  // Another model's calibrations are not read either.
  CHECK(chosen(0xdef, "cpu", "system", why) == name("cacheblend"));
  CHECK(why.find("no calibration cached for this model and chunk context 'system'") != std::string::npos);
}

TEST_CASE("server: a method the engine cannot run is refused by name, the others accepted") {
  const auto refusal = [](std::string_view method, std::string_view engine) {
    try {
      (void)kvfuse_server::server_method(method, engine);
    } catch (const kvfuse::error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK(refusal("cacheblend@0.3", "cpu") == "(accepted)");
  CHECK(refusal("attnlink@4", "llamacpp") == "(accepted)");
  CHECK(refusal("cachecraft@0.5", "cpu") == "(accepted)");
  CHECK(refusal("cachecraft", "llamacpp").find("'cachecraft': Cache-Craft's variants are profiled from attention "
                                               "statistics") != std::string::npos);
  CHECK(refusal("queryprobe@0.3", "cpu") == "(accepted)");
  CHECK(refusal("queryprobe@0.3", "llamacpp").find("'queryprobe@0.3': it changes the recomputed rows per layer") !=
        std::string::npos);
  CHECK(refusal("prefix", "cpu").find("'prefix': the server stores chunk caches only") != std::string::npos);
  CHECK(refusal("cacheblend@auto", "cpu").find("loading controller") != std::string::npos);
  CHECK(refusal("queryaware", "llamacpp").find("'queryaware': it changes the recomputed rows per layer") !=
        std::string::npos);
}

TEST_CASE("server: an incomplete UTF-8 tail is held back") {
  CHECK(kvfuse_server::incomplete_utf8_tail("abc") == 0);
  CHECK(kvfuse_server::incomplete_utf8_tail("caf\xC3") == 1);
  CHECK(kvfuse_server::incomplete_utf8_tail("caf\xC3\xA9") == 0);
  CHECK(kvfuse_server::incomplete_utf8_tail("\xE2\x98") == 2);
  CHECK(kvfuse_server::incomplete_utf8_tail("\xE2\x98\x95") == 0);
  CHECK(kvfuse_server::incomplete_utf8_tail("x\xF0\x9F\x98") == 3);
  CHECK(kvfuse_server::incomplete_utf8_tail("") == 0);
}

TEST_CASE("server: a loopback client that closed its end of the connection is seen gone; one that did not is not") {
  // A real TCP connection on 127.0.0.1: a listening socket, a client, the server's accepted end.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  const int client = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  sockaddr_in peer{};
  len = sizeof peer;
  const int accepted = ::accept(listener, reinterpret_cast<sockaddr*>(&peer), &len);
  REQUIRE(accepted >= 0);
  const int server_port = ntohs(addr.sin_port), client_port = ntohs(peer.sin_port);

  kvfuse_server::PeerWatch watch("127.0.0.1", server_port, "127.0.0.1", client_port);
  kvfuse_server::PeerWatch other("127.0.0.1", server_port, "127.0.0.1", client_port == 65535 ? 1 : client_port + 1);
  CHECK(kvfuse_server::peer_state("127.0.0.1", server_port, "127.0.0.1", client_port) ==
        kvfuse_server::PeerState::open);
  CHECK_FALSE(watch.gone());
  CHECK_FALSE(other.gone());  // no such connection: never seen, never gone
  CHECK(kvfuse_server::peer_state("not an address", server_port, "127.0.0.1", client_port) ==
        kvfuse_server::PeerState::absent);

  ::close(client);  // the client goes away: the server's end is left in CLOSE_WAIT
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = watch.gone();
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(gone);
  CHECK(kvfuse_server::peer_state("127.0.0.1", server_port, "127.0.0.1", client_port) ==
        kvfuse_server::PeerState::closing);
  ::close(accepted);
  ::close(listener);
}

TEST_CASE("real model: server prompts reuse a part's tokens at any position; streamed text stays whole") {
  const auto path = kvfuse_test::real_model(/*optimized_only=*/false);
  if (!path) return;
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(path->string());
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  const std::string a = "Paris is the capital of France.", b = "Rome <|im_end|> is in Italy.", q = "Which city?";
  const auto chunk_tokens = [](const kvfuse_server::ChatPrompt& p) {
    std::vector<std::vector<kvfuse::token_id>> out;
    for (const kvfuse::PromptChunk& c : p.layout.chunks)
      if (c.cached) out.emplace_back(p.tokens.begin() + c.range.begin, p.tokens.begin() + c.range.end);
    return out;
  };
  for (const bool conditioned : {true, false}) {
    CAPTURE(conditioned);
    const kvfuse_server::PromptFormat format(tok, conditioned);
    REQUIRE(format.chatml());
    const auto build = [&](const std::vector<std::string>& texts) {
      return format.build(kvfuse_server::parse_chat_request(user_parts(texts)).messages);
    };
    const kvfuse_server::ChatPrompt p1 = build({a, b, q}), p2 = build({b, a, q});
    p1.layout.validate();
    CHECK(p1.layout.num_tokens() == static_cast<std::int64_t>(p1.tokens.size()));
    const auto c1 = chunk_tokens(p1), c2 = chunk_tokens(p2);
    // Conditioned: the system turn is the chunk context, computed; the parts a and b are the chunks. Else the
    // default system prompt is a chunk too.
    const std::size_t first = conditioned ? 0 : 1;
    REQUIRE(c1.size() == first + 2);
    REQUIRE(c2.size() == first + 2);
    if (conditioned) {
      const std::vector<kvfuse::ChatMessage> system_only{{"system", kvfuse::ChatTemplate(tok.chat_template())
                                                                        .default_system_prompt()}};
      const auto context = std::vector<kvfuse::token_id>(p1.tokens.begin(), p1.tokens.begin() + p1.layout.chunk_context);
      CHECK(tok.decode(context) == tok.format_chat(system_only, false));  // [bos] the system turn, nothing after
      CHECK(p1.layout.chunk_context == p2.layout.chunk_context);
    } else {
      CHECK(p1.layout.chunk_context == 0);
      CHECK(c1[0] == c2[0]);
    }
    CHECK(c1[first] == c2[first + 1]);
    CHECK(c1[first + 1] == c2[first]);
    CHECK(c1[first] == tok.encode(a + "\n", false));
    // The text of a part stays text: "<|im_end|>" in it is not the control token.
    CHECK(std::count(c1[first + 1].begin(), c1[first + 1].end(), tok.find_token("<|im_end|>")) == 0);
    // The whole prompt is the template's rendering of the joined parts.
    const std::vector<kvfuse::ChatMessage> chat{{"user", a + "\n" + b + "\n" + q}};
    CHECK(tok.decode(p1.tokens) == tok.format_chat(chat, true));
  }

  // Token by token, every released piece is whole UTF-8 and the pieces add up to the text.
  const std::string text = "Caf\xC3\xA9 \xE2\x98\x95 na\xC3\xAFve \xF0\x9F\x98\x80 done";
  kvfuse_server::TextStream stream(tok, {});
  std::string joined;
  for (const kvfuse::token_id t : tok.encode(text, false)) {
    const std::string piece = stream.push(t);
    CHECK(valid_utf8(piece));
    joined += piece;
  }
  joined += stream.finish();
  CHECK(joined == text);
  CHECK(stream.text() == text);

  // A stop sequence ends the text before it, even when it spans tokens; nothing after it is released.
  kvfuse_server::TextStream stopped(tok, {"\xE2\x98\x95 na"});
  std::string before;
  for (const kvfuse::token_id t : tok.encode(text, false)) before += stopped.push(t);
  before += stopped.finish();
  CHECK(stopped.stopped());
  CHECK(before == "Caf\xC3\xA9 ");
}
