#pragma once
// The correctness gate (fusion/calibration.hpp) on the reference CPU backend: TeacherForcedEvaluator measures
// a setting over sample prompts against full prefill (teacher-forced KL and top-1 agreement over full
// prefill's greedy answer, recompute fraction), and calibration files cache a Calibration per model
// fingerprint, family, budget and sample set, so a model is calibrated once.
//
// File format (text, one record per line): "kvfuse-calibration 3", then "fingerprint <hex>", "family <name>",
// "budget <max KL> <min top-1>", "samples <hex>", "chunk-context <label>" (what the sample prompts' chunk caches
// were computed behind: the caller's name for it, e.g. "none" or "system"; PromptLayout::chunk_context),
// "naive <recomputed> <KL> <top-1>" (naive reuse, which every
// setting must not lose to), one "point <method> <recomputed> <KL> <top-1> <admitted 0|1>" per setting measured,
// and "chosen <method>" or "refused". Version 2 files (no chunk-context record) were measured on caches computed
// alone and read as "none"; version 1 files (no naive record) are refused like any other foreign file. A file that
// does not parse is an error naming the file, the line and the value.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/cpu/llama.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/hash.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/harness/metrics.hpp"
#include "kvfuse/fusion/calibration.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/fusion_result.hpp"

namespace kvfuse::eval {

struct CalibrationPrompt {
  std::vector<token_id> tokens;
  PromptLayout layout;
};

// Measures settings on `prompts` through `pipeline` (a FusionPipeline over a CpuLlamaFusion whose store holds
// the prompts' chunk caches). Full prefill runs once per prompt, at construction: its greedy answer (up to
// answer_tokens, stopping at eos) and its distributions over that answer are the reference.
template <class Pipeline>
class TeacherForcedEvaluator {
 public:
  TeacherForcedEvaluator(const CpuLlama& model, Pipeline& pipeline, std::vector<CalibrationPrompt> prompts,
                         std::int64_t answer_tokens, token_id eos)
      : model_(model), pipeline_(pipeline), prompts_(std::move(prompts)) {
    detail::require(!prompts_.empty(), "TeacherForcedEvaluator: no sample prompts");
    detail::require(answer_tokens >= 1, "TeacherForcedEvaluator: answer_tokens = {} must be >= 1", answer_tokens);
    for (const CalibrationPrompt& p : prompts_) {
      const FusionResult full = pipeline_.run(p.tokens, p.layout, FullRecompute{});
      LlamaKVCache kv = pipeline_.backend().kv();
      answers_.push_back(model_.greedy_decode(kv, full.logits, answer_tokens, eos));
      kv = pipeline_.backend().kv();
      reference_.push_back(model_.forced_logits(kv, full.logits, answers_.back()));
    }
  }

  // Means over the prompts; a prompt whose full-prefill answer is empty (eos first) counts for the recompute
  // fraction only.
  CalibrationMeasure operator()(const FusionMethod& method) {
    CalibrationMeasure m;
    std::size_t forced = 0;
    for (std::size_t i = 0; i < prompts_.size(); ++i) {
      const FusionResult r = pipeline_.run(prompts_[i].tokens, prompts_[i].layout, method);
      m.recompute_fraction += r.recompute_fraction;
      if (answers_[i].empty()) continue;
      LlamaKVCache kv = pipeline_.backend().kv();
      const TeacherForced tf = teacher_forced(reference_[i], model_.forced_logits(kv, r.logits, answers_[i]));
      m.kl_answer_mean += tf.kl_mean;
      m.top1_agreement += tf.top1_agreement;
      ++forced;
    }
    detail::require(forced > 0, "TeacherForcedEvaluator: full prefill answers every sample prompt with eos first");
    m.recompute_fraction /= static_cast<double>(prompts_.size());
    m.kl_answer_mean /= static_cast<double>(forced);
    m.top1_agreement /= static_cast<double>(forced);
    return m;
  }

  // Identifies the sample set (prompts, their chunk contexts and reference answers) in calibration file names.
  [[nodiscard]] std::uint64_t samples_hash() const noexcept {
    Xxh3Stream h;
    const auto add = [&h](std::span<const token_id> t) {
      h.update_value(static_cast<std::uint64_t>(t.size()));
      h.update(std::as_bytes(t));
    };
    for (std::size_t i = 0; i < prompts_.size(); ++i) {
      add(prompts_[i].tokens);
      h.update_value(static_cast<std::uint64_t>(prompts_[i].layout.chunk_context));
      add(answers_[i]);
    }
    return h.digest();
  }

 private:
  const CpuLlama& model_;
  Pipeline& pipeline_;
  std::vector<CalibrationPrompt> prompts_;
  std::vector<std::vector<token_id>> answers_;
  std::vector<std::vector<std::vector<float>>> reference_;
};

// A chunk context's name in a calibration file: one word.
[[nodiscard]] inline bool is_chunk_context_label(std::string_view label) noexcept {
  return !label.empty() && label.find_first_of(" \t\r\n") == std::string_view::npos;
}

// <dir>/<fingerprint>-<family>-<budget and samples hash>.calibration
[[nodiscard]] inline std::filesystem::path calibration_file(const std::filesystem::path& dir,
                                                            std::uint64_t fingerprint, std::string_view family,
                                                            const CalibrationBudget& budget,
                                                            std::uint64_t samples_hash) {
  const std::string budget_text = fmt::format("{} {}", budget.max_kl_answer, budget.min_top1_agreement);
  const std::uint64_t key = xxh3(std::as_bytes(std::span(budget_text.data(), budget_text.size())), samples_hash);
  return dir / fmt::format("{:016x}-{}-{:016x}.calibration", fingerprint, family, key);
}

// Writes atomically (a temporary file renamed over `path`).
inline void save_calibration(const std::filesystem::path& path, const Calibration& c, std::uint64_t samples_hash,
                             std::string_view chunk_context) {
  detail::require(is_chunk_context_label(chunk_context),
                  "save_calibration: chunk context label '{}' is empty or not one word", chunk_context);
  std::string s = fmt::format(
      "kvfuse-calibration 3\nfingerprint {:016x}\nfamily {}\nbudget {} {}\nsamples {:016x}\nchunk-context {}\n"
      "naive {} {} {}\n",
      c.model_fingerprint, c.family, c.budget.max_kl_answer, c.budget.min_top1_agreement, samples_hash, chunk_context,
      c.naive.recompute_fraction, c.naive.kl_answer_mean, c.naive.top1_agreement);
  for (const CalibrationPoint& p : c.points)
    s += fmt::format("point {} {} {} {} {}\n", p.method, p.measure.recompute_fraction, p.measure.kl_answer_mean,
                     p.measure.top1_agreement, p.admitted ? 1 : 0);
  s += c.chosen ? fmt::format("chosen {}\n", *c.chosen) : std::string("refused\n");
  std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << s;
    out.flush();
    detail::require(static_cast<bool>(out), "save_calibration: cannot write {}", tmp.string());
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  detail::require(!ec, "save_calibration: cannot rename {} to {}: {}", tmp.string(), path.string(), ec.message());
}

// Reads a file save_calibration wrote. Throws kvfuse::error naming the file, line and value on anything else,
// and when it holds another fingerprint, family, budget, sample set or chunk context than asked for.
[[nodiscard]] inline Calibration load_calibration(const std::filesystem::path& path, std::uint64_t fingerprint,
                                                  std::string_view family, const CalibrationBudget& budget,
                                                  std::uint64_t samples_hash, std::string_view chunk_context) {
  std::ifstream in(path, std::ios::binary);
  detail::require(static_cast<bool>(in), "load_calibration: cannot open {}", path.string());
  Calibration c;
  std::string line;
  int number = 0;
  bool ended = false;
  bool has_naive = false;
  int version = 0;
  std::optional<std::string> context;
  const auto fail = [&](std::string_view what) {
    throw error(fmt::format("load_calibration: {} line {}: {} ('{}')", path.string(), number, what, line));
  };
  const auto hex = [&](const std::string& text) {
    std::size_t used = 0;
    std::uint64_t v = 0;
    try {
      v = std::stoull(text, &used, 16);
    } catch (const std::exception&) {
      fail("not a hexadecimal number");
    }
    if (used != text.size() || text.size() != 16) fail("not a 16-digit hexadecimal number");
    return v;
  };
  while (std::getline(in, line)) {
    ++number;
    std::istringstream words(line);
    std::string tag;
    words >> tag;
    if (ended) fail("text after the end record");
    if (number == 1) {
      if (line == "kvfuse-calibration 2" || line == "kvfuse-calibration 3") version = line.back() - '0';
      else fail("not a kvfuse calibration file of version 2 or 3");
      continue;
    }
    std::string a, b;
    if (tag == "fingerprint" && words >> a) {
      if (hex(a) != fingerprint) fail(fmt::format("calibrated for another model (asked for {:016x})", fingerprint));
      c.model_fingerprint = fingerprint;
    } else if (tag == "family" && words >> a) {
      if (a != family) fail(fmt::format("calibrates another family (asked for {})", family));
      c.family = a;
    } else if (tag == "budget" && words >> c.budget.max_kl_answer >> c.budget.min_top1_agreement) {
      if (c.budget.max_kl_answer != budget.max_kl_answer || c.budget.min_top1_agreement != budget.min_top1_agreement)
        fail(fmt::format("calibrated for another budget (asked for {} {})", budget.max_kl_answer,
                         budget.min_top1_agreement));
    } else if (tag == "samples" && words >> a) {
      if (hex(a) != samples_hash) fail("calibrated on other sample prompts");
    } else if (tag == "chunk-context" && version == 3 && !context && words >> a) {
      if (a != chunk_context)
        fail(fmt::format("calibrated with chunk caches behind chunk context '{}' (asked for '{}')", a, chunk_context));
      context = a;
    } else if (tag == "naive") {
      if (!(words >> c.naive.recompute_fraction >> c.naive.kl_answer_mean >> c.naive.top1_agreement))
        fail("naive needs <recomputed> <KL> <top-1>");
      has_naive = true;
    } else if (tag == "point") {
      CalibrationPoint p;
      int within = -1;
      if (!(words >> p.method >> p.measure.recompute_fraction >> p.measure.kl_answer_mean >>
            p.measure.top1_agreement >> within) ||
          (within != 0 && within != 1))
        fail("a point needs <method> <recomputed> <KL> <top-1> <0|1>");
      p.admitted = within == 1;
      c.points.push_back(std::move(p));
    } else if (tag == "chosen" && words >> a) {
      c.chosen = a;
      ended = true;
    } else if (tag == "refused") {
      ended = true;
    } else {
      fail("unknown or incomplete record");
    }
    if (words >> b) fail("extra text");
  }
  if (number == 0) fail("empty file");
  if (!ended) fail("no chosen / refused record (truncated file?)");
  if (c.family.empty() || c.points.empty() || !has_naive) fail("no family, no naive record or no points");
  if (version == 2 && chunk_context != "none")  // version 2 measured caches computed alone
    fail(fmt::format("a version 2 file, calibrated on chunk caches computed alone (asked for chunk context '{}')",
                     chunk_context));
  if (version == 3 && !context) fail("no chunk-context record");
  c.budget.validate();
  if (c.chosen) (void)parse_method(*c.chosen);
  return c;
}

}  // namespace kvfuse::eval
