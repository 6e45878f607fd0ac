#pragma once
// A chat completion request of OpenAI's API, read and checked field by field (ApiError names the field), and its
// prompt as chunks: what kvfuse-server hands CpuBatchEngine.
//
// Chunks. Every text part of a message's content array ({"type": "text", "text": ...}) is a chunk whose KV is
// stored once and reused at any position (CacheBlend's chunk cache): it is tokenized on its own, as the text
// followed by "\n" (the parts of a message are joined by newlines), so its tokens never depend on its neighbours.
// The system turn (BOS, the system prompt) is the chunk context (PromptLayout::chunk_context): always computed, and
// every chunk cache is computed behind it, so that a part's first tokens are not attention sinks (with
// --chunk-context none it is a chunk like the parts, and chunk caches are computed alone). The last part of the last message, and everything after it (the end of the
// turn, the generation prompt), is the query. A message whose content is a plain string reuses nothing: its tokens
// are computed (a chunk marked not cached, or the query when it is the last message). The template's glue between
// the parts (role headers, end-of-turn tokens) is computed as well.
//
// With a ChatML template (SmolLM2), as Tokenizer::format_chat renders it, the template's default system prompt
// injected when the conversation has none:
//   [bos] <|im_start|>system\n{system}<|im_end|>\n                       the chunk context (computed)
//   <|im_start|>{role}\n                                                  computed
//   {part}\n                                                              a chunk per part
//   <|im_end|>\n                                                          computed (a message before the last)
//   {last part of the last message}<|im_end|>\n<|im_start|>assistant\n   the query
// Without one (a base model such as Gemma 3 270M) the same as plain text: the system prompt and every message on
// lines of their own, without roles, the model continuing the last message's text.
// Caller text is tokenized with parse_special = false: a part cannot inject control tokens.
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/model/chat_template.hpp"
#include "kvfuse/model/text_tokenizer.hpp"

namespace kvfuse_server {

// An error answered with OpenAI's error body: {"error": {"message", "type", "param", "code"}}.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)),
        status_(status),
        param_(std::move(param)),
        code_(std::move(code)),
        type_(std::move(type)) {}

  [[nodiscard]] int status() const noexcept { return status_; }
  [[nodiscard]] nlohmann::json body() const {
    return {{"error",
             {{"message", what()},
              {"type", type_},
              {"param", param_.empty() ? nlohmann::json() : nlohmann::json(param_)},
              {"code", code_.empty() ? nlohmann::json() : nlohmann::json(code_)}}}};
  }

 private:
  int status_;
  std::string param_, code_, type_;
};

struct ChatMessage {
  std::string role;
  bool parts = false;               // content was an array of text parts (each a chunk), not a string
  std::vector<std::string> texts;   // the parts, or the one string
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::optional<std::int64_t> max_tokens;
  double temperature = 1.0;         // OpenAI's default
  std::optional<std::uint64_t> seed;
  std::vector<std::string> stop;    // stop sequences on the decoded text
  bool stream = false;
  bool include_usage = false;       // stream_options.include_usage: a last chunk with the usage
  std::optional<std::string> method;  // the extension field kvfuse.method: this request's fusion method
};

namespace detail {

inline ApiError bad(std::string param, std::string_view message) {
  std::string text = fmt::format("{}: {}", param, message);
  return ApiError(400, std::move(text), std::move(param), "invalid_value");
}

inline const nlohmann::json* field(const nlohmann::json& body, const char* name) {
  const auto it = body.find(name);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace detail

// Reads and checks a request body; ApiError (400) naming the first bad field.
[[nodiscard]] inline ChatRequest parse_chat_request(const nlohmann::json& body) {
  using detail::bad;
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object", "", "invalid_json");
  ChatRequest r;
  if (const auto* model = detail::field(body, "model"); model != nullptr && !model->is_string())
    throw bad("model", fmt::format("must be a string, not {}", model->type_name()));

  const auto* messages = detail::field(body, "messages");
  if (messages == nullptr) throw ApiError(400, "messages: required", "messages", "missing_required_parameter");
  if (!messages->is_array() || messages->empty()) throw bad("messages", "must be a non-empty array of messages");
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::json& m = (*messages)[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) throw bad(at, fmt::format("must be an object, not {}", m.type_name()));
    ChatMessage msg;
    const auto* role = detail::field(m, "role");
    if (role == nullptr || !role->is_string()) throw bad(at + ".role", "must be a string");
    msg.role = role->get<std::string>();
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant")
      throw bad(at + ".role", fmt::format("'{}' is not system, user or assistant", msg.role));
    const auto* content = detail::field(m, "content");
    if (content == nullptr) throw bad(at + ".content", "required");
    if (content->is_string()) {
      msg.texts.push_back(content->get<std::string>());
    } else if (content->is_array()) {
      if (content->empty()) throw bad(at + ".content", "an empty array of parts");
      msg.parts = true;
      for (std::size_t j = 0; j < content->size(); ++j) {
        const nlohmann::json& p = (*content)[j];
        const std::string pat = fmt::format("{}.content[{}]", at, j);
        if (!p.is_object()) throw bad(pat, "must be an object {\"type\": \"text\", \"text\": ...}");
        const auto* type = detail::field(p, "type");
        if (type == nullptr || !type->is_string() || type->get<std::string>() != "text")
          throw bad(pat + ".type", "only text parts ({\"type\": \"text\"}) are supported");
        const auto* text = detail::field(p, "text");
        if (text == nullptr || !text->is_string()) throw bad(pat + ".text", "must be a string");
        msg.texts.push_back(text->get<std::string>());
      }
    } else {
      throw bad(at + ".content", fmt::format("must be a string or an array of text parts, not {}",
                                             content->type_name()));
    }
    r.messages.push_back(std::move(msg));
  }

  const auto* max_tokens = detail::field(body, "max_completion_tokens");
  const char* max_name = "max_completion_tokens";
  if (max_tokens == nullptr) {
    max_tokens = detail::field(body, "max_tokens");
    max_name = "max_tokens";
  }
  if (max_tokens != nullptr) {
    if (!max_tokens->is_number_integer() || (max_tokens->is_number_unsigned() && max_tokens->get<std::uint64_t>() >
                                             static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())))
      throw bad(max_name, "must be an integer");
    const auto n = max_tokens->get<std::int64_t>();
    if (n < 1) throw bad(max_name, fmt::format("{} must be >= 1", n));
    r.max_tokens = n;
  }

  if (const auto* t = detail::field(body, "temperature")) {
    if (!t->is_number()) throw bad("temperature", "must be a number");
    r.temperature = t->get<double>();
    if (!std::isfinite(r.temperature) || r.temperature < 0.0 || r.temperature > 2.0)
      throw bad("temperature", fmt::format("{} is not in [0, 2]", r.temperature));
  }
  if (const auto* s = detail::field(body, "seed")) {
    if (!s->is_number_integer()) throw bad("seed", "must be an integer");
    r.seed = s->is_number_unsigned() ? s->get<std::uint64_t>() : static_cast<std::uint64_t>(s->get<std::int64_t>());
  }
  if (const auto* stop = detail::field(body, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const nlohmann::json& s : *stop) {
        if (!s.is_string()) throw bad("stop", "must be a string or an array of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      throw bad("stop", "must be a string or an array of strings");
    }
    if (r.stop.size() > 4) throw bad("stop", fmt::format("{} stop sequences; at most 4", r.stop.size()));
    for (const std::string& s : r.stop)
      if (s.empty()) throw bad("stop", "a stop sequence is empty");
  }
  if (const auto* stream = detail::field(body, "stream")) {
    if (!stream->is_boolean()) throw bad("stream", "must be a boolean");
    r.stream = stream->get<bool>();
  }
  if (const auto* options = detail::field(body, "stream_options")) {
    if (!options->is_object()) throw bad("stream_options", "must be an object");
    if (const auto* usage = detail::field(*options, "include_usage")) {
      if (!usage->is_boolean()) throw bad("stream_options.include_usage", "must be a boolean");
      r.include_usage = usage->get<bool>();
    }
  }
  if (const auto* n = detail::field(body, "n"); n != nullptr && !(n->is_number_integer() && n->get<std::int64_t>() == 1))
    throw bad("n", "only n = 1 is supported");
  if (const auto* ext = detail::field(body, "kvfuse")) {
    if (!ext->is_object()) throw bad("kvfuse", "must be an object {\"method\": ...}");
    if (const auto* method = detail::field(*ext, "method")) {
      if (!method->is_string()) throw bad("kvfuse.method", "must be a string");
      r.method = method->get<std::string>();
    }
  }
  return r;
}

// A prompt and its layout: chunks (cached: reusable; not cached: computed) and the query.
struct ChatPrompt {
  std::vector<kvfuse::token_id> tokens;
  kvfuse::PromptLayout layout;
};

namespace detail {

// Appends tokens as reusable chunks, computed glue (runs of it merged into one chunk marked not cached) or the
// query (from its first token to the end).
class LayoutBuilder {
 public:
  void glue(std::span<const kvfuse::token_id> t) {
    if (!in_query_ && glue_begin_ < 0) glue_begin_ = size();
    append(t);
  }
  void chunk(std::span<const kvfuse::token_id> t) {
    if (in_query_) {  // nothing after the query is reused
      append(t);
      return;
    }
    close_glue();
    const std::int64_t begin = size();
    append(t);
    p_.layout.chunks.push_back({{begin, size()}, true});
  }
  void query(std::span<const kvfuse::token_id> t) {
    if (!in_query_) {
      close_glue();
      in_query_ = true;
      query_begin_ = size();
    }
    append(t);
  }
  // What came so far is the chunk context (PromptLayout::chunk_context): every chunk cache is computed behind it.
  void end_context() {
    close_glue();
    p_.layout.chunk_context = size();
  }
  ChatPrompt finish() && {
    if (!in_query_) query({});
    p_.layout.query = {query_begin_, size()};
    return std::move(p_);
  }

 private:
  [[nodiscard]] std::int64_t size() const noexcept { return static_cast<std::int64_t>(p_.tokens.size()); }
  void append(std::span<const kvfuse::token_id> t) { p_.tokens.insert(p_.tokens.end(), t.begin(), t.end()); }
  void close_glue() {
    if (glue_begin_ < 0) return;
    p_.layout.chunks.push_back({{glue_begin_, size()}, false});
    glue_begin_ = -1;
  }
  ChatPrompt p_;
  std::int64_t glue_begin_ = -1;
  std::int64_t query_begin_ = 0;
  bool in_query_ = false;
};

}  // namespace detail

// How kvfuse-server renders messages (see the header comment): ChatML when the model's template is ChatML, else
// plain text.
class PromptFormat {
 public:
  // conditioned: the chunk caches are computed behind the system turn (PromptLayout::chunk_context), which is glue;
  // else the system prompt is a chunk.
  PromptFormat(const kvfuse::Tokenizer& tok, bool conditioned) : tok_(&tok), conditioned_(conditioned) {
    if (tok.chat_template().empty()) return;
    try {
      default_system_ = kvfuse::ChatTemplate(tok.chat_template()).default_system_prompt();
    } catch (const kvfuse::error&) {
      return;  // not ChatML: plain text (chatml() says so)
    }
    im_start_ = tok.find_token("<|im_start|>");
    im_end_ = tok.find_token("<|im_end|>");
    chatml_ = im_start_ != kvfuse::kNoToken && im_end_ != kvfuse::kNoToken;
  }

  [[nodiscard]] bool chatml() const noexcept { return chatml_; }

  // The prompt of `messages`; ApiError naming the message whose text is unusable.
  [[nodiscard]] ChatPrompt build(const std::vector<ChatMessage>& messages) const {
    detail::LayoutBuilder b;
    const auto encode = [this](std::string_view text) { return tok_->encode(text, /*parse_special=*/false); };
    const std::vector<kvfuse::token_id> newline = encode("\n");
    if (tok_->add_bos()) b.glue(std::vector<kvfuse::token_id>{tok_->bos()});

    std::size_t first = 0;
    std::string system = chatml_ ? default_system_ : std::string();
    bool has_system = chatml_ && !default_system_.empty();
    if (messages.front().role == "system") {
      system.clear();
      for (std::size_t j = 0; j < messages.front().texts.size(); ++j)
        system += (j == 0 ? "" : "\n") + messages.front().texts[j];
      has_system = true;
      first = 1;
      if (messages.size() == 1)
        throw ApiError(400, "messages: only a system message; the conversation needs a message to answer",
                       "messages", "invalid_value");
    }
    if (has_system) {
      std::vector<kvfuse::token_id> t;
      if (chatml_) {
        t.push_back(im_start_);
        append(t, encode("system\n" + system));
        t.push_back(im_end_);
        append(t, newline);
      } else if (!system.empty()) {
        t = encode(system + "\n");
      }
      if (conditioned_) b.glue(t);
      else b.chunk(t);
    }
    if (conditioned_) b.end_context();
    for (std::size_t i = first; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      const bool last = i + 1 == messages.size();
      if (chatml_) {
        std::vector<kvfuse::token_id> head{im_start_};
        append(head, encode(m.role + "\n"));
        b.glue(head);
      }
      for (std::size_t j = 0; j < m.texts.size(); ++j) {
        const bool final_text = last && j + 1 == m.texts.size();
        if (final_text) {
          const std::vector<kvfuse::token_id> q = encode(m.texts[j]);
          if (q.empty() && !chatml_)
            throw ApiError(400, fmt::format("messages[{}].content: the last text is empty; the model continues it", i),
                           fmt::format("messages[{}].content", i), "invalid_value");
          b.query(q);
        } else if (m.parts) {
          b.chunk(encode(m.texts[j] + "\n"));
        } else {
          b.glue(encode(chatml_ ? m.texts[j] : m.texts[j] + "\n"));
        }
      }
      if (chatml_) {
        std::vector<kvfuse::token_id> tail{im_end_};
        append(tail, newline);
        if (last) {
          tail.push_back(im_start_);
          append(tail, encode("assistant\n"));
        }
        if (last) b.query(tail);
        else b.glue(tail);
      }
    }
    return std::move(b).finish();
  }

 private:
  static void append(std::vector<kvfuse::token_id>& to, const std::vector<kvfuse::token_id>& t) {
    to.insert(to.end(), t.begin(), t.end());
  }
  const kvfuse::Tokenizer* tok_;
  bool conditioned_ = false;
  bool chatml_ = false;
  std::string default_system_;
  kvfuse::token_id im_start_ = kvfuse::kNoToken;
  kvfuse::token_id im_end_ = kvfuse::kNoToken;
};

}  // namespace kvfuse_server
