#pragma once
// ChatTemplate: a model's chat template (`tokenizer.chat_template`), for ChatML templates only (e.g. SmolLM2,
// Qwen2): formats chat messages as the text the model was trained on.

#include <fmt/format.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "kvfuse/core/error.hpp"

namespace kvfuse {

struct ChatMessage {
  std::string role;
  std::string content;
};

// A chat template, recognised from its Jinja source rather than run: only ChatML
// ("<|im_start|>{role}\n{content}<|im_end|>\n" per message, "<|im_start|>assistant\n" as generation
// prompt) is supported; anything else throws kvfuse::error on construction. When the template injects a
// default system message if the first message is not a system one (SmolLM2's does, in an "if ... != 'system'"
// branch; Qwen2's in the "else" of "if messages[0]['role'] == 'system'"), that text is taken from the template's
// first '<|im_start|>system\n...<|im_end|>' literal with plain text inside and injected the same way.
class ChatTemplate {
 public:
  explicit ChatTemplate(std::string_view source);

  [[nodiscard]] std::string format(std::span<const ChatMessage> messages, bool add_generation_prompt) const;

  // Empty when the template has none.
  [[nodiscard]] const std::string& default_system_prompt() const noexcept { return default_system_; }

 private:
  std::string default_system_;
};

inline ChatTemplate::ChatTemplate(std::string_view source) {
  detail::require(source.find("<|im_start|>") != std::string_view::npos,
                  "tokenizer: unsupported chat template (only ChatML, '<|im_start|>role\\n...<|im_end|>', is "
                  "supported): '{}'",
                  source.substr(0, 120));
  // The default system message, when the template inserts one for a conversation without a system message.
  // Its literal may spell the newline as a real newline or as the Jinja escape "\n".
  const bool tests_role = source.find("!= 'system'") != std::string_view::npos ||
                          source.find("!= \"system\"") != std::string_view::npos ||
                          source.find("['role'] == 'system'") != std::string_view::npos;
  if (!tests_role) return;
  for (std::string_view newline : {std::string_view("\n"), std::string_view("\\n")}) {
    const std::string head = fmt::format("<|im_start|>system{}", newline);
    for (std::size_t at = source.find(head); at != std::string_view::npos; at = source.find(head, at + 1)) {
      const std::size_t begin = at + head.size();
      const std::size_t end = source.find("<|im_end|>", begin);
      if (end == std::string_view::npos) break;
      const std::string_view text = source.substr(begin, end - begin);
      // Only a plain literal counts; an expression such as '{{ messages[0].content }}' is not a default.
      if (text.find_first_of("{}'\"\\") != std::string_view::npos) continue;
      default_system_ = std::string(text);
      return;
    }
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

}  // namespace kvfuse
