#pragma once
// FusionMethod: the eight ways to assemble a prompt's KV from stored chunk caches, as value types, and
// FusionPlan, what a method decided for one prompt before any compute ran (plain data for tests and logs).
//
// Every method is the same layer-wise partial prefill (CacheBlend §4.3, Epic §4.2, Cache-Craft §3.2); they
// differ only in where each chunk's KV comes from and in the selected set S_l:
//   FullRecompute   S_l = every token; nothing loaded. The quality reference.
//   PrefixCaching   the longest run of leading chunks stored as a prefix (each entry computed behind exactly
//                   the same earlier chunks) is loaded; S_l = every token after it, on every layer. Exact.
//   NaiveReuse      every chunk's isolated cache loaded and RoPE-shifted; S_l = the query (and chunks with no
//                   cache). The lower bound every blending method improves on.
//   CacheBlend      isolated caches; layer 0 computes everything, check layers keep the tokens whose KV
//                   deviates most, down to r (HKVDSelector, CacheBlend section 4.3).
//   AttnLink        isolated caches; the first k tokens of every non-first chunk plus the query, on every
//                   layer (AttnLinkBoundary, Epic section 4.2).
//   CacheCraft      chunk caches computed in context (variants from earlier prompts, VariantCache); per chunk
//                   the N = ceil(CFO · |C|) tokens with the most attention to earlier chunks (Cache-Craft
//                   eq. 12, 14); recomputation of unfocused chunks stops at the layer L* of Algorithm 1
//                   (FocusedChunkDetector). "-cover": β also scaled by the share of the current prefix the
//                   variant's prefix held (CCIScorerConfig::prefix_coverage, kvfuse's extension of eq. 6).
//   QueryAware      isolated caches; CacheBlend's schedule, but check layers keep the tokens the query rows
//                   attend to most, optionally mixed with the KV deviation (QueryAwareSelector). kvfuse's
//                   variant of the idea of ProphetKV (2026), not a reimplementation of that paper.
//   QueryProbe      isolated caches; two passes. A probe pass is naive reuse that also reports, on every layer,
//                   the query's attention over every row; the rows of highest mean share over the layers, r of
//                   the reused rows, are then recomputed on every layer in a second pass (QueryProbeSelector).
//                   After ProphetKV's (2026) dual-stage idea: the query's attention from every layer, not only
//                   CacheBlend's early check layers, decides; the layer fusion here is kvfuse's own.
// When to use which: prefix caching when prompts share exact prefixes; otherwise CacheBlend when nothing is
// known about the chunks in advance, AttnLink when the cheapest static selection is enough, Cache-Craft when
// chunk caches are kept from earlier prompts with their attention statistics; QueryAware where CacheBlend would
// run, to recompute what the question reads rather than what deviates (kvfuse-rag-eval measures both); QueryProbe
// where fidelity per recomputed row matters more than a second pass's latency (docs/fidelity.md). Measured
// on SmolLM2 and Gemma 3 over MuSiQue (docs/results.md): the query mass alone (λ = 1) closes little of naive
// reuse's gap, as the check layers 1-3 see mostly the question's attention to what is near it; mixed with the
// KV deviation (λ = 0.5, "queryaware@0.15:0.5") about as much as CacheBlend's selection.
//
// Names: method_name() gives "full", "prefix", "naive", "cacheblend", "attnlink", "cachecraft", "queryaware",
// "queryprobe" for the default settings (r = 0.15, k = 16, alpha = 1, lambda = 1) and "name@value" otherwise
// ("cacheblend@auto": the loading controller picks r). QueryAware takes r and the mix lambda: "queryaware@0.2"
// (lambda = 1), "queryaware@0.15:0.5" (r = 0.15, lambda = 0.5; lambda is written only when it is not 1); QueryProbe
// r: "queryprobe@0.3". Cache-Craft adds "-nofocus" without focus termination and "-cover" with prefix coverage, in
// that order: "cachecraft@0.125-nofocus-cover". parse_method() reads every one of these.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/select/attnlink_boundary.hpp"
#include "kvfuse/select/cci_scorer.hpp"
#include "kvfuse/select/focused_chunk_detector.hpp"
#include "kvfuse/select/hkvd_selector.hpp"

namespace kvfuse {

struct FullRecompute {};
struct PrefixCaching {};
struct NaiveReuse {};
// Which cached tensor CacheBlend's per-token KV deviation compares, recomputed against cached (section 4.1).
enum class KVTensor { key, value };

struct CacheBlend {
  HKVDConfig config{};
  // The engine computes the deviation of this tensor on check layers and HKVDSelector ranks it. CacheBlend's
  // reference implementation ranks by V (the default).
  KVTensor rank_by = KVTensor::value;
  // CacheBlend §5.1's loading controller picks r per request: max(r*, the ratio whose recompute takes as long as
  // loading a layer), with r* = config.recompute_ratio and the load and compute speeds FusionPipeline measured
  // on its previous layer-pipelined run (r* until one was measured). Name: "cacheblend@auto".
  bool loading_controller = false;
};
struct AttnLink {
  AttnLinkConfig config{};
};
struct CacheCraft {
  CCIScorerConfig scoring{};           // how VariantCache scores the variants: α (eq. 12), prefix coverage
  FocusedChunkConfig focus{};          // Algorithm 1 window w
  bool focus_termination = true;       // stop recomputing unfocused chunks at L* (section 3.2.2)
};
// Query-aware selection, inspired by ProphetKV (2026), which recomputes the tokens the query will attend to
// rather than those whose KV deviates most. This is kvfuse's variant, not a reimplementation of that paper: on
// CacheBlend's check layers (layer 0 computes every token, CacheBlend §4.3) the engine reports the attention
// mass the query rows pay to each computed row, and QueryAwareSelector keeps, with CacheBlend's gradual-filtering
// budgets, the reused tokens of highest score λ · query mass + (1 − λ) · KV deviation, each term divided by
// its sum over the candidates (select/query_aware_selector.hpp). λ = 0 is CacheBlend's selection exactly.
struct QueryAware {
  HKVDConfig config{};                 // r and the gradual-filtering schedule, as CacheBlend's
  double query_weight = 1.0;           // λ in [0, 1]: the query mass's share of the score
  KVTensor rank_by = KVTensor::value;  // the tensor of the deviation term (read when λ < 1)
};

// Two passes (see the header comment): naive reuse with the query's attention over every row on every layer, then
// the naive rows and the ratio · |reused rows| reused rows of highest fused query attention, on every layer.
struct QueryProbe {
  double recompute_ratio = 0.15;  // r: the share of the reused rows the second pass recomputes, in [0, 1]

  void validate() const {
    detail::require(recompute_ratio >= 0.0 && recompute_ratio <= 1.0,
                    "QueryProbe: recompute_ratio {} is not in [0, 1]", recompute_ratio);
  }
};

using FusionMethod =
    std::variant<FullRecompute, PrefixCaching, NaiveReuse, CacheBlend, AttnLink, CacheCraft, QueryAware, QueryProbe>;

namespace detail {

[[nodiscard]] inline std::string format_setting(double v) { return fmt::format("{:g}", v); }

[[nodiscard]] inline double parse_setting(std::string_view name, std::string_view v) {
  double x = 0;
  const auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  require(ec == std::errc{} && p == v.data() + v.size() && std::isfinite(x),
          "fusion method '{}': setting '{}' is not a number", name, v);
  return x;
}

}  // namespace detail

// CacheBlend (or QueryAware) with recompute ratio r; gradual filtering keeps its margins above r, capped so the
// schedule stays non-increasing up to 1.
template <class Method>
  requires(std::is_same_v<Method, CacheBlend> || std::is_same_v<Method, QueryAware>)
[[nodiscard]] Method with_recompute_ratio(Method c, double r) {
  c.config.recompute_ratio = r;
  for (double& margin : c.config.ratio_margins) margin = std::min(margin, 1.0 - r);
  c.config.validate();
  return c;
}

// "cacheblend" / "cacheblend@0.05", ... (see the header comment).
[[nodiscard]] inline std::string method_name(const FusionMethod& m) {
  struct Visitor {
    std::string operator()(const FullRecompute&) const { return "full"; }
    std::string operator()(const PrefixCaching&) const { return "prefix"; }
    std::string operator()(const NaiveReuse&) const { return "naive"; }
    std::string operator()(const CacheBlend& c) const {
      if (c.loading_controller) return "cacheblend@auto";
      return c.config.recompute_ratio == HKVDConfig{}.recompute_ratio
                 ? "cacheblend"
                 : "cacheblend@" + detail::format_setting(c.config.recompute_ratio);
    }
    std::string operator()(const AttnLink& a) const {
      return a.config.k == AttnLinkConfig{}.k ? "attnlink" : fmt::format("attnlink@{}", a.config.k);
    }
    std::string operator()(const CacheCraft& c) const {
      const double alpha = c.scoring.alpha;
      std::string s = alpha == 1.0 ? "cachecraft" : "cachecraft@" + detail::format_setting(alpha);
      if (!c.focus_termination) s += "-nofocus";
      return c.scoring.prefix_coverage ? s + "-cover" : s;
    }
    std::string operator()(const QueryAware& q) const {
      const double r = q.config.recompute_ratio;
      if (q.query_weight != 1.0)
        return "queryaware@" + detail::format_setting(r) + ":" + detail::format_setting(q.query_weight);
      return r == HKVDConfig{}.recompute_ratio ? "queryaware" : "queryaware@" + detail::format_setting(r);
    }
    std::string operator()(const QueryProbe& p) const {
      return p.recompute_ratio == QueryProbe{}.recompute_ratio
                 ? "queryprobe"
                 : "queryprobe@" + detail::format_setting(p.recompute_ratio);
    }
  };
  return std::visit(Visitor{}, m);
}

// Reads a method name: full, prefix, naive, cacheblend[@r|@auto], attnlink[@k],
// cachecraft[@alpha][-nofocus][-cover], queryaware[@r[:lambda]], queryprobe[@r].
[[nodiscard]] inline FusionMethod parse_method(std::string_view text) {
  const std::size_t at = text.find('@');
  std::string_view name = text.substr(0, at);
  std::string_view setting = at == std::string_view::npos ? std::string_view{} : text.substr(at + 1);
  detail::require(at == std::string_view::npos || !setting.empty(), "fusion method '{}': no value after '@'", text);
  const auto no_setting = [&] {
    detail::require(at == std::string_view::npos, "fusion method '{}' takes no setting", text);
  };
  if (name == "full") return no_setting(), FusionMethod{FullRecompute{}};
  if (name == "prefix") return no_setting(), FusionMethod{PrefixCaching{}};
  if (name == "naive") return no_setting(), FusionMethod{NaiveReuse{}};
  if (name == "cacheblend") {
    CacheBlend c;
    if (setting == "auto") {
      c.loading_controller = true;
      return c;
    }
    return with_recompute_ratio(c, setting.empty() ? c.config.recompute_ratio : detail::parse_setting(text, setting));
  }
  if (name == "attnlink") {
    AttnLink a;
    if (!setting.empty()) {
      const double k = detail::parse_setting(text, setting);
      detail::require(k >= 0 && k <= 1e9 && k == std::floor(k),
                      "fusion method '{}': k = {} must be a whole number in [0, 1e9]", text, setting);
      a.config.k = static_cast<std::int64_t>(k);
    }
    a.config.validate();
    return a;
  }
  if (text.starts_with("cachecraft")) {
    CacheCraft c;
    std::string_view rest = text.substr(std::string_view("cachecraft").size());
    if (rest.ends_with("-cover")) {
      c.scoring.prefix_coverage = true;
      rest.remove_suffix(std::string_view("-cover").size());
    }
    if (rest.ends_with("-nofocus")) {
      c.focus_termination = false;
      rest.remove_suffix(std::string_view("-nofocus").size());
    }
    if (!rest.empty()) {
      detail::require(rest.front() == '@',
                      "unknown fusion method '{}' (expected cachecraft[@alpha][-nofocus][-cover], in that order)",
                      text);
      c.scoring.alpha = detail::parse_setting(text, rest.substr(1));
    }
    detail::require(c.scoring.alpha >= 0, "fusion method '{}': alpha = {} must be >= 0", text, c.scoring.alpha);
    return c;
  }
  if (name == "queryaware") {
    QueryAware q;
    const std::size_t colon = setting.find(':');
    const std::string_view ratio = setting.substr(0, colon);
    detail::require(at == std::string_view::npos || !ratio.empty(),
                    "fusion method '{}': no r before ':' (expected queryaware@r:lambda)", text);
    if (colon != std::string_view::npos) {
      const std::string_view lambda = setting.substr(colon + 1);
      detail::require(!lambda.empty(), "fusion method '{}': no lambda after ':' (expected queryaware@r:lambda)",
                      text);
      q.query_weight = detail::parse_setting(text, lambda);
      detail::require(q.query_weight >= 0.0 && q.query_weight <= 1.0,
                      "fusion method '{}': lambda = {} must be in [0, 1]", text, lambda);
    }
    return with_recompute_ratio(q, ratio.empty() ? q.config.recompute_ratio : detail::parse_setting(text, ratio));
  }
  if (name == "queryprobe") {
    QueryProbe p;
    if (!setting.empty()) p.recompute_ratio = detail::parse_setting(text, setting);
    detail::require(p.recompute_ratio >= 0.0 && p.recompute_ratio <= 1.0,
                    "fusion method '{}': r = {} must be in [0, 1]", text, setting);
    return p;
  }
  throw error(fmt::format("unknown fusion method '{}' (expected full, prefix, naive, cacheblend[@r|@auto], "
                          "attnlink[@k], cachecraft[@alpha][-nofocus][-cover], queryaware[@r[:lambda]], "
                          "queryprobe[@r])",
                          text));
}

struct ChunkPlan {
  TokenRange range;                    // the chunk's rows in this prompt
  KVSource source = KVSource::compute;  // where the chunk's KV comes from
  KVKey key;                           // store key of the loaded KV (not for compute)
  std::int64_t stored_first_position = 0;  // where the stored K was rotated; the shift is range.begin − this
  // Cache-Craft: CFO of the chosen variant (eq. 12) and the chunk-local tokens it recomputes (eq. 14).
  double cfo = 0.0;
  TokenSet recompute;
  std::uint64_t variant_id = 0;  // Cache-Craft: the chosen VariantCache entry (source == variant)
  std::uint64_t bytes = 0;       // bytes of the stored entry to read (0 for compute)

  // The RoPE shift of the loaded K: from where it was rotated to its rows here.
  [[nodiscard]] std::int64_t shift() const noexcept { return range.begin - stored_first_position; }
};

// The statistics a method's per-layer policy reads after each layer: what an engine computes for that request,
// and nothing else (LayerReport, fusion/layer_protocol.hpp).
struct StatisticsNeeds {
  bool k_deviation = false;  // per selected row, |K recomputed − K cached|² (CacheBlend §4.1)
  bool v_deviation = false;  // the same for V
  bool chunk_mass = false;   // LayerAttention::mass over the plan's layout (Cache-Craft's focus, eq. 15)
  bool self_mass = false;    // LayerAttention::self_mass (Cache-Craft eq. 4 excludes it)
  bool query_mass = false;   // LayerReport::query_mass of the layout's query rows (QueryAware)

  [[nodiscard]] bool any() const noexcept { return k_deviation || v_deviation || chunk_mass || self_mass || query_mass; }
  friend bool operator==(const StatisticsNeeds&, const StatisticsNeeds&) = default;
};

struct FusionPlan {
  std::uint64_t request_id = 0;   // the engine's id of the request it plans
  std::string method;
  std::vector<ChunkPlan> chunks;  // one per layout chunk, same order
  PromptLayout layout;            // the prompt's layout with cached = (source != compute)
  TokenSet initial;               // S_0
  bool per_layer = false;         // S_l changes per layer: the engine calls the policy after every layer
  // QueryProbe: S_0 .. S_{L-1} is a probe pass; a second prefill of the rows it chose follows, over the same KV
  // (FusionPipeline runs both; an engine with its own step loop gets the rows from FusionConnector::second_pass).
  bool two_pass = false;
  StatisticsNeeds statistics;     // what that policy reads

  [[nodiscard]] std::uint64_t bytes_to_read() const noexcept {
    std::uint64_t total = 0;
    for (const ChunkPlan& c : chunks) total += c.bytes;
    return total;
  }
};

}  // namespace kvfuse
