#pragma once
// Quality metrics for a RAG evaluation (e.g. MuSiQue) that compares a KV-reuse method against full prefill:
//  - fidelity to full prefill: kl_divergence of the first answer token's distribution (full-prefill logits
//    as the reference); teacher_forced: the mean KL and top-1 agreement over the full-prefill answer's tokens,
//    fed to both (a weak model's diverging greedy answers cannot blur it); exact_match / rouge_l of the greedy
//    answer against the full-prefill answer;
//  - accuracy: token_f1 / max_token_f1 of the answer against the gold answers, as in CacheBlend's and
//    MuSiQue's evaluation.
// Text metrics compare answers after normalize_answer, the official SQuAD / HotpotQA / MuSiQue
// normalization (lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse::detail {

// Python's string.punctuation: !"#$%&'()*+,-./:;<=>?@[\]^_`{|}~
[[nodiscard]] inline bool is_ascii_punct(unsigned char c) noexcept {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
         (c >= 0x7B && c <= 0x7E);
}

// The whitespace Python's str.split() splits on, restricted to ASCII.
[[nodiscard]] inline bool is_ascii_space(unsigned char c) noexcept {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= 0x1C && c <= 0x1F);
}

// A character of a regex \w word: ASCII letters, digits and '_', and (as Python treats non-ASCII letters)
// every non-ASCII byte.
[[nodiscard]] inline bool is_word_byte(unsigned char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c >= 0x80;
}

[[nodiscard]] inline bool is_article(std::string_view word) noexcept {
  return word == "a" || word == "an" || word == "the";
}

}  // namespace kvfuse::detail

namespace kvfuse::eval {

// The median of v (the mean of the middle two for an even count); v must not be empty.
[[nodiscard]] inline double median(std::vector<double> v) {
  detail::require(!v.empty(), "median: no values");
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// SQuAD's normalize_answer: white_space_fix(remove_articles(remove_punc(lower(s)))). Lowercasing and
// punctuation are ASCII only; non-ASCII bytes are kept as they are and count as word characters, so
// "thé" is not the article "the".
[[nodiscard]] inline std::string normalize_answer(std::string_view s) {
  std::string cleaned;
  cleaned.reserve(s.size());
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (detail::is_ascii_punct(c)) continue;
    cleaned.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : ch);
  }
  // re.sub(r"\b(a|an|the)\b", " ", ·): a maximal run of word characters equal to an article becomes a space.
  std::string words;
  words.reserve(cleaned.size());
  for (std::size_t i = 0; i < cleaned.size();) {
    if (!detail::is_word_byte(static_cast<unsigned char>(cleaned[i]))) {
      words.push_back(cleaned[i++]);
      continue;
    }
    std::size_t end = i;
    while (end < cleaned.size() && detail::is_word_byte(static_cast<unsigned char>(cleaned[end]))) ++end;
    const std::string_view word(cleaned.data() + i, end - i);
    if (detail::is_article(word)) {
      words.push_back(' ');
    } else {
      words.append(word);
    }
    i = end;
  }
  // " ".join(·.split())
  std::string out;
  out.reserve(words.size());
  for (std::size_t i = 0; i < words.size();) {
    if (detail::is_ascii_space(static_cast<unsigned char>(words[i]))) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < words.size() && !detail::is_ascii_space(static_cast<unsigned char>(words[end]))) ++end;
    if (!out.empty()) out.push_back(' ');
    out.append(words, i, end - i);
    i = end;
  }
  return out;
}

// normalize_answer(s) split on spaces; empty when nothing survives normalization.
[[nodiscard]] inline std::vector<std::string> answer_tokens(std::string_view s) {
  const std::string normalized = normalize_answer(s);
  std::vector<std::string> tokens;
  for (std::size_t i = 0; i < normalized.size();) {
    const std::size_t space = std::min(normalized.find(' ', i), normalized.size());
    tokens.emplace_back(normalized, i, space - i);
    i = space + 1;
  }
  return tokens;
}

// True when a and b are equal after normalize_answer.
[[nodiscard]] inline bool exact_match(std::string_view a, std::string_view b) {
  return normalize_answer(a) == normalize_answer(b);
}

// SQuAD token F1: with c the size of the multiset intersection of the two answer_tokens,
// P = c / |prediction|, R = c / |gold|, F1 = 2PR / (P + R) (0 when c = 0). An empty side gives 0, unless
// both are empty, which gives 1.
[[nodiscard]] inline double token_f1(std::string_view prediction, std::string_view gold) {
  std::vector<std::string> pred_tokens = answer_tokens(prediction);
  std::vector<std::string> gold_tokens = answer_tokens(gold);
  if (pred_tokens.empty() || gold_tokens.empty()) return pred_tokens.empty() && gold_tokens.empty() ? 1.0 : 0.0;
  std::sort(pred_tokens.begin(), pred_tokens.end());
  std::sort(gold_tokens.begin(), gold_tokens.end());
  std::size_t common = 0;
  for (std::size_t i = 0, j = 0; i < pred_tokens.size() && j < gold_tokens.size();) {
    if (pred_tokens[i] < gold_tokens[j]) {
      ++i;
    } else if (gold_tokens[j] < pred_tokens[i]) {
      ++j;
    } else {
      ++common, ++i, ++j;
    }
  }
  if (common == 0) return 0.0;
  const double precision = static_cast<double>(common) / static_cast<double>(pred_tokens.size());
  const double recall = static_cast<double>(common) / static_cast<double>(gold_tokens.size());
  return 2.0 * precision * recall / (precision + recall);
}

// Best token_f1 of `prediction` over the gold answers (a MuSiQue question has an answer and its aliases).
// Throws when `golds` is empty.
[[nodiscard]] inline double max_token_f1(std::string_view prediction, std::span<const std::string> golds) {
  detail::require(!golds.empty(), "max_token_f1: golds is empty (prediction '{}')", prediction);
  double best = 0.0;
  for (const std::string& gold : golds) best = std::max(best, token_f1(prediction, gold));
  return best;
}

// ROUGE-L F-measure with beta = 1: with L the longest common subsequence of the two answer_tokens,
// P = L / |candidate|, R = L / |reference|, F = 2PR / (P + R) (0 when L = 0). 1 when both are empty, 0 when
// only one is. O(|candidate| · |reference|) time, O(|reference|) memory.
[[nodiscard]] inline double rouge_l(std::string_view candidate, std::string_view reference) {
  const std::vector<std::string> cand = answer_tokens(candidate);
  const std::vector<std::string> ref = answer_tokens(reference);
  if (cand.empty() || ref.empty()) return cand.empty() && ref.empty() ? 1.0 : 0.0;
  std::vector<std::size_t> prev(ref.size() + 1, 0);
  std::vector<std::size_t> curr(ref.size() + 1, 0);
  for (const std::string& c : cand) {
    for (std::size_t j = 1; j <= ref.size(); ++j) {
      curr[j] = c == ref[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], curr[j - 1]);
    }
    std::swap(prev, curr);
  }
  const std::size_t lcs = prev[ref.size()];
  if (lcs == 0) return 0.0;
  const double precision = static_cast<double>(lcs) / static_cast<double>(cand.size());
  const double recall = static_cast<double>(lcs) / static_cast<double>(ref.size());
  return 2.0 * precision * recall / (precision + recall);
}

// log softmax of `logits`, computed in double after subtracting the maximum. Throws on empty input or a
// non-finite logit.
[[nodiscard]] inline std::vector<double> log_softmax(std::span<const float> logits) {
  detail::require(!logits.empty(), "log_softmax: logits is empty");
  double max_logit = logits[0];
  for (std::size_t i = 0; i < logits.size(); ++i) {
    detail::require(std::isfinite(logits[i]), "log_softmax: logits[{}] = {} is not finite", i, logits[i]);
    max_logit = std::max(max_logit, static_cast<double>(logits[i]));
  }
  double sum = 0.0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - max_logit);
  const double log_sum = std::log(sum);
  std::vector<double> out(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - max_logit - log_sum;
  return out;
}

// KL(P_ref || P) = sum_i p_ref_i (log p_ref_i − log p_i), where P_ref = softmax(reference_logits) (full
// prefill) and P = softmax(logits) (the method under test). Rounding below 0 is clamped to 0. Throws when
// the sizes differ, and as log_softmax does.
[[nodiscard]] inline double kl_divergence(std::span<const float> reference_logits, std::span<const float> logits) {
  detail::require(reference_logits.size() == logits.size(),
                          "kl_divergence: reference_logits has {} entries but logits has {}",
                          reference_logits.size(), logits.size());
  const std::vector<double> log_p_ref = log_softmax(reference_logits);
  const std::vector<double> log_p = log_softmax(logits);
  double kl = 0.0;
  for (std::size_t i = 0; i < log_p.size(); ++i) kl += std::exp(log_p_ref[i]) * (log_p_ref[i] - log_p[i]);
  return std::max(kl, 0.0);
}

// Teacher-forced fidelity over an answer: reference[i] and method[i] are the distributions (logits) that predict
// answer token i after the same answer prefix, from full prefill's KV and from the method's.
struct TeacherForced {
  double kl_mean = 0.0;         // mean over tokens of KL(full ‖ method)
  double top1_agreement = 0.0;  // share of tokens where both put the same token first
  std::size_t tokens = 0;
};

// Throws when the two sequences differ in length or are empty, and as kl_divergence does.
[[nodiscard]] inline TeacherForced teacher_forced(std::span<const std::vector<float>> reference,
                                                  std::span<const std::vector<float>> method) {
  detail::require(reference.size() == method.size() && !reference.empty(),
                  "teacher_forced: {} reference distributions but {} of the method (need the same, >= 1)",
                  reference.size(), method.size());
  TeacherForced out;
  out.tokens = reference.size();
  for (std::size_t i = 0; i < reference.size(); ++i) {
    out.kl_mean += kl_divergence(reference[i], method[i]);
    out.top1_agreement += argmax_token(reference[i]) == argmax_token(method[i]) ? 1.0 : 0.0;
  }
  out.kl_mean /= static_cast<double>(out.tokens);
  out.top1_agreement /= static_cast<double>(out.tokens);
  return out;
}

}  // namespace kvfuse::eval
