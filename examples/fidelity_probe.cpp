// kvfuse-fidelity-probe: why recomputing a subset of tokens can be worse than recomputing none (docs/fidelity.md).
// On fixed MuSiQue prompts it builds the naive-reuse KV by hand (each chunk prefilled alone at position 0, or with
// --chunk-context system behind the system segment as kvfuse-server stores them, K RoPE-shifted to its prompt
// position) and runs CpuLlama::partial_prefill with selection rules the fusion
// methods do not offer, so that each candidate cause can be switched on and off alone:
//
//   full          every row on every layer over the merged KV: must equal full prefill exactly (bug check)
//   naive         the query rows only
//   hkvd@r        CacheBlend's HKVDSelector (check layers 1-3, margins 0.10 / 0.05 / 0, ranked by V deviation)
//   hkvd+s@r      the same with the first s tokens of every chunk not at position 0 always kept (inside r)
//   hkvd-s@r      the same with those tokens ranked last (their stale, sink-like KV kept unless r reaches them)
//   random@r      the same schedule, the kept tokens drawn uniformly at random (seeded)
//   starts@s      the first s tokens of every chunk not at position 0, on every layer (AttnLink-s, Epic §4.2)
//   chunks@r      whole chunks, last first, up to r of the reusable tokens, on every layer (no fresh/stale mix
//                 inside a chunk)
//   depth@m       every row on layers 0 .. m-1, the query only after (how far fresh layers alone go)
//   full-bf16     full prefill by the same model with bf16 weight products (CpuProducts::bf16, Intel AMX), fed
//                 fp32 full prefill's answer: what a rounding-sized change to every row does to the same figures
//                 (a yardstick for the top-1 agreement and KL of the reuse methods, not a reuse method)
//
// Per method: teacher-forced KL(full ‖ method) over full prefill's greedy answer (mean and per answer token, with
// whether each token's top-1 is kept; per question full prefill's top-1 probability margin of each), the
// first token's KL, the computed share of full prefill's row-layers and, per layer, the squared V deviation from
// full prefill of the rows it recomputed (after, and as loaded) and of the query rows; per question the per-layer KV deviation of the naive merge against full prefill, split into
// each chunk's first token and its other tokens. Writes one JSON object to stdout.
//
//   kvfuse-fidelity-probe --data musique_dev.json [--model smollm2|gemma3|qwen2|GGUF] [--start 0] [--limit 2]
//                         [--max-passages 5] [--max-passage-tokens 0] [--answer-tokens 32]
//                         [--methods naive,hkvd@0.15,...] [--check-layers 1,2,3] [--threads 0]
//                         [--chunk-context none|system]
// --check-layers sets the hkvd / random check layers; the margins are 0.05 per later check (0.10, 0.05, 0 for three).

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvfuse/cpu.hpp"
#include "kvfuse/harness/metrics.hpp"
#include "kvfuse/harness/rag_prompt.hpp"
#include "kvfuse/kernel_args/kv_topk.hpp"

#include "musique.hpp"

namespace {

constexpr std::string_view kSystem = "You are a helpful assistant. Answer the question using the documents, in a few words.";

struct Probe {
  std::string kind;  // full, naive, hkvd, hkvd+s, random, starts, chunks, depth
  double value = 0;  // r, s or m
  std::int64_t starts = 0;
};

Probe parse_probe(const std::string& name) {
  Probe p;
  const auto at = name.find('@');
  p.kind = name.substr(0, at);
  if (at != std::string::npos) p.value = kvfuse_example::parse_real("--methods", name.substr(at + 1));
  if (p.kind.starts_with("hkvd+") || p.kind.starts_with("hkvd-")) {
    p.starts = kvfuse_example::parse_int("--methods", p.kind.substr(5));
    p.kind = p.kind.substr(0, 5) + "s";
  }
  kvfuse::require(p.kind == "full" || p.kind == "full-bf16" || p.kind == "naive" || p.kind == "hkvd" ||
                      p.kind == "hkvd+s" || p.kind == "hkvd-s" || p.kind == "random" || p.kind == "starts" ||
                      p.kind == "chunks" || p.kind == "depth",
                  "--methods: unknown probe '{}'", name);
  return p;
}

// The first `s` rows of every cached chunk that does not start at position 0.
kvfuse::TokenSet chunk_starts(const kvfuse::PromptLayout& layout, std::int64_t s) {
  kvfuse::TokenSet rows;
  for (const kvfuse::PromptChunk& c : layout.chunks)
    if (c.cached && c.range.begin > 0)
      for (std::int64_t t = c.range.begin; t < std::min(c.range.end, c.range.begin + s); ++t) rows.push_back(t);
  return rows;
}

// The probability of the top token minus that of the second, from logits.
double top_margin(const std::vector<float>& logits) {
  std::vector<double> log_p = kvfuse::eval::log_softmax(logits);
  std::partial_sort(log_p.begin(), log_p.begin() + 2, log_p.end(), std::greater<>());
  return std::exp(log_p[0]) - std::exp(log_p[1]);
}

kvfuse::TokenSet with_query(kvfuse::TokenSet rows, const kvfuse::PromptLayout& layout) {
  kvfuse::append_range(rows, layout.query);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  return rows;
}

}  // namespace

int main(int argc, char** argv) try {
  std::string data, model_name = "smollm2", methods = "full,naive,hkvd@0.15,hkvd+1@0.15,random@0.15,starts@1";
  std::vector<int> check_layers{1, 2, 3};
  bool conditioned = false;  // --chunk-context system
  std::int64_t start = 0, limit = 2, max_passages = 5, max_passage_tokens = 0, answer_tokens = 32, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i], v = argv[i + 1];
    if (flag == "--data") data = v;
    else if (flag == "--chunk-context") {
      kvfuse::require(v == "system" || v == "none", "--chunk-context: '{}' is neither system nor none", v);
      conditioned = v == "system";
    }
    else if (flag == "--model") model_name = v;
    else if (flag == "--methods") methods = v;
    else if (flag == "--start") start = kvfuse_example::parse_int(flag, v);
    else if (flag == "--limit") limit = kvfuse_example::parse_int(flag, v);
    else if (flag == "--max-passages") max_passages = kvfuse_example::parse_int(flag, v);
    else if (flag == "--max-passage-tokens") max_passage_tokens = kvfuse_example::parse_int(flag, v);
    else if (flag == "--answer-tokens") answer_tokens = kvfuse_example::parse_int(flag, v);
    else if (flag == "--threads") threads = kvfuse_example::parse_int(flag, v);
    else if (flag == "--check-layers") {
      check_layers.clear();
      for (const std::string& l : kvfuse_example::split(v))
        check_layers.push_back(static_cast<int>(kvfuse_example::parse_int(flag, l)));
    }
    else throw kvfuse::error(fmt::format("unknown flag '{}'", flag));
  }
  kvfuse::require(!data.empty(), "--data FILE is required");
  const std::string path = kvfuse_example::resolve_model(model_name);
  const kvfuse::GGUFFile file = kvfuse::GGUFFile::open(path);
  const kvfuse::Tokenizer tok = kvfuse::Tokenizer::from_gguf(file);
  kvfuse::CpuLlamaOptions options;
  options.threads = static_cast<int>(threads);
  const kvfuse::CpuLlama model = kvfuse::CpuLlama::from_gguf(file, options);
  const std::int64_t L = model.config().n_layer;
  const std::vector<std::string> names = kvfuse_example::split(methods);
  std::optional<kvfuse::CpuLlama> bf16_model;  // full-bf16 only; refused with a message naming it without AMX
  if (std::find(names.begin(), names.end(), "full-bf16") != names.end()) {
    kvfuse::CpuLlamaOptions bf16 = options;
    bf16.products = kvfuse::CpuProducts::bf16;
    bf16_model.emplace(kvfuse::CpuLlama::from_gguf(file, bf16));
  }

  nlohmann::json out;
  out["model"] = std::filesystem::path(path).filename().string();
  out["passages"] = max_passages;
  out["max_passage_tokens"] = max_passage_tokens;
  out["chunk_context"] = conditioned ? "system" : "none";
  std::map<std::string, std::array<double, 4>> kl_sum;  // per method: [answer KL, first KL, recomputed, top-1]
  const auto add = [&kl_sum](const std::string& name, const kvfuse::eval::TeacherForced& tf, double first,
                             double recomputed) {
    std::array<double, 4>& s = kl_sum[name];
    s[0] += tf.kl_mean;
    s[1] += first;
    s[2] += recomputed;
    s[3] += tf.top1_agreement;
    fmt::print(stderr, "{:>14}  KL answer {:.4f}  first {:.4f}  compute {:.3f}  top-1 {:.3f}\n", name, tf.kl_mean,
               first, recomputed, tf.top1_agreement);
  };
  for (const kvfuse_example::Question& q : kvfuse_example::load_questions(data, start, limit, max_passages)) {
    std::vector<std::string> passages;
    for (const std::string& p : q.passages) {
      if (max_passage_tokens == 0) {
        passages.push_back(p);
        continue;
      }
      auto ids = tok.encode(p, false);
      ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(max_passage_tokens)));
      std::string text = tok.decode(ids, false);
      text.resize(kvfuse::utf8_invalid_offset(text));
      passages.push_back(text);
    }
    const kvfuse::RagPrompt prompt = kvfuse::build_rag_prompt(tok, kSystem, passages, q.question);
    const kvfuse::PromptLayout layout = prompt.layout();
    const std::span<const kvfuse::token_id> tokens = prompt.tokens;
    const auto n = static_cast<std::int64_t>(tokens.size());

    // Reference: full prefill, its greedy answer and its distributions over that answer.
    const kvfuse::LlamaPrefill full = model.full_prefill(tokens);
    kvfuse::LlamaKVCache kv = full.kv;
    const std::vector<kvfuse::token_id> answer = model.greedy_decode(kv, full.logits, answer_tokens, tok.eos());
    kv = full.kv;
    const std::vector<std::vector<float>> reference = model.forced_logits(kv, full.logits, answer);

    // The naive merge: every chunk alone at position 0, K rotated to its prompt position; the query rows are
    // placeholders (every method computes them).
    kvfuse::LlamaKVCache merged;
    const kvfuse::TokenRange c0 = layout.chunks.front().range;
    for (const kvfuse::PromptChunk& c : layout.chunks) {
      if (conditioned && c.range.begin > 0) {  // behind the system segment, its rows kept, shifted from c0.end
        std::vector<kvfuse::token_id> both(tokens.begin(), tokens.begin() + c0.end);
        both.insert(both.end(), tokens.begin() + c.range.begin, tokens.begin() + c.range.end);
        kvfuse::LlamaKVCache all = model.prefill_chunk(both, 0);
        kvfuse::LlamaKVCache chunk = all.slice({c0.end, all.num_rows()});
        model.rope_shift(chunk, {0, chunk.num_rows()}, c.range.begin - c0.end);
        merged.append(chunk);
        continue;
      }
      kvfuse::LlamaKVCache chunk = model.prefill_chunk(tokens.subspan(static_cast<std::size_t>(c.range.begin),
                                                                      static_cast<std::size_t>(c.range.size())),
                                                       0);
      model.rope_shift(chunk, {0, chunk.num_rows()}, c.range.begin);
      merged.append(chunk);
    }
    merged.append(model.prefill_chunk(tokens.subspan(static_cast<std::size_t>(layout.query.begin)), layout.query.begin));

    // Per layer: mean squared V / K deviation of the naive merge from full prefill, chunk-first tokens vs the rest.
    nlohmann::json deviation = nlohmann::json::array();
    const kvfuse::TokenSet firsts = chunk_starts(layout, 1);
    const std::int64_t dim = model.config().kv_dim();
    for (std::int64_t l = 0; l < L; ++l) {
      double v_first = 0, v_rest = 0, k_first = 0, k_rest = 0;
      std::int64_t n_first = 0, n_rest = 0;
      for (const kvfuse::PromptChunk& c : layout.chunks) {
        if (c.range.begin == 0) continue;
        for (std::int64_t t = c.range.begin; t < c.range.end; ++t) {
          double dv = 0, dk = 0;
          for (std::int64_t i = 0; i < dim; ++i) {
            dv += std::pow(merged.v_row(l, t)[i] - full.kv.v_row(l, t)[i], 2);
            dk += std::pow(merged.k_row(l, t)[i] - full.kv.k_row(l, t)[i], 2);
          }
          (t == c.range.begin ? v_first : v_rest) += dv;
          (t == c.range.begin ? k_first : k_rest) += dk;
          ++(t == c.range.begin ? n_first : n_rest);
        }
      }
      deviation.push_back({{"layer", l}, {"v_first", v_first / n_first}, {"v_rest", v_rest / n_rest},
                           {"k_first", k_first / n_first}, {"k_rest", k_rest / n_rest}});
    }

    // Per answer token: full prefill's probability of its top token minus that of its runner-up (how near a tie
    // the token a method must keep is), and per method KL(full ‖ method) and whether the top token is kept.
    std::vector<double> margins;
    for (const std::vector<float>& z : reference) margins.push_back(top_margin(z));
    const auto per_token = [&reference](const std::vector<std::vector<float>>& forced) {
      std::vector<double> kl;
      std::vector<int> kept;
      for (std::size_t i = 0; i < forced.size(); ++i) {
        kl.push_back(kvfuse::eval::kl_divergence(reference[i], forced[i]));
        kept.push_back(kvfuse::argmax_token(reference[i]) == kvfuse::argmax_token(forced[i]) ? 1 : 0);
      }
      return nlohmann::json{{"kl_per_answer_token", kl}, {"top1_per_answer_token", kept}};
    };
    nlohmann::json qj{{"question", q.question}, {"tokens", n}, {"answer", tok.decode(answer, false)},
                      {"answer_top_margin", margins}, {"naive_kv_deviation", deviation}};
    std::int64_t reusable = 0;
    for (const kvfuse::PromptChunk& c : layout.chunks)
      if (c.range.begin > 0) reusable += c.range.size();
    for (const std::string& name : names) {
      const Probe p = parse_probe(name);
      if (p.kind == "full-bf16") {
        const kvfuse::LlamaPrefill other = bf16_model->full_prefill(tokens);
        kvfuse::LlamaKVCache other_kv = other.kv;
        const std::vector<std::vector<float>> forced = bf16_model->forced_logits(other_kv, other.logits, answer);
        const kvfuse::eval::TeacherForced tf = kvfuse::eval::teacher_forced(reference, forced);
        const double first = kvfuse::eval::kl_divergence(full.logits, other.logits);
        qj["methods"][name] = per_token(forced);
        qj["methods"][name].update({{"kl_answer_mean", tf.kl_mean}, {"top1", tf.top1_agreement},
                                    {"kl_first_token", first}, {"compute_fraction", 1.0}});
        add(name, tf, first, 1.0);
        continue;
      }
      kvfuse::TokenSet initial;
      kvfuse::SelectionPolicy policy;
      std::int64_t computed = 0;  // rows computed over all layers, reported by the policy
      kvfuse::HKVDConfig hk;
      hk.recompute_ratio = p.value;
      hk.check_layers = check_layers;
      hk.ratio_margins.assign(check_layers.size(), 0.0);
      for (std::size_t i = 0; i + 1 < check_layers.size(); ++i)
        hk.ratio_margins[i] = std::min(0.05 * static_cast<double>(check_layers.size() - 1 - i), 1.0 - p.value);
      if (p.kind == "full" || p.kind == "hkvd" || p.kind == "hkvd+s" || p.kind == "hkvd-s" ||
          p.kind == "random") {
        kvfuse::append_range(initial, {0, n});
      } else if (p.kind == "naive") {
        initial = with_query({}, layout);
      } else if (p.kind == "starts") {
        initial = with_query(chunk_starts(layout, static_cast<std::int64_t>(p.value)), layout);
      } else if (p.kind == "chunks") {
        kvfuse::TokenSet rows;
        std::int64_t budget = kvfuse::top_k_count(p.value, reusable);
        for (auto c = layout.chunks.rbegin(); c != layout.chunks.rend() && budget > 0; ++c) {
          if (c->range.begin == 0) continue;
          kvfuse::append_range(rows, c->range);
          budget -= c->range.size();
        }
        initial = with_query(rows, layout);
      } else if (p.kind == "depth") {
        kvfuse::append_range(initial, {0, n});
        const kvfuse::TokenSet query = with_query({}, layout);
        const auto m = static_cast<std::int64_t>(p.value);
        policy = [m, query](const kvfuse::LayerReport& r) { return r.layer + 1 >= m ? query : r.selected; };
      }
      if (p.kind == "hkvd" || p.kind == "hkvd+s" || p.kind == "hkvd-s" || p.kind == "random") {
        auto selector = std::make_shared<kvfuse::HKVDSelector>(hk, layout, static_cast<int>(L));
        const kvfuse::TokenSet forced = chunk_starts(layout, p.starts);
        auto rng = std::make_shared<std::mt19937_64>(12345);
        const bool random = p.kind == "random";
        const float forced_score = p.kind == "hkvd-s" ? 0.0f : 1e30f;
        policy = [selector, forced, rng, random, forced_score](const kvfuse::LayerReport& r) {
          if (!selector->is_check_layer(static_cast<int>(r.layer))) return r.selected;
          std::vector<float> score(r.v_deviation.begin(), r.v_deviation.end());
          if (random) {
            std::uniform_real_distribution<float> u(0.0f, 1.0f);
            for (float& s : score) s = u(*rng);
          }
          // hkvd+s: the chunk starts rank above every other row (scores are >= 0) and take the first places of
          // the budget; hkvd-s: they rank last (kept stale unless the budget reaches them).
          for (std::size_t i = 0; i < r.selected.size(); ++i)
            if (std::binary_search(forced.begin(), forced.end(), r.selected[i])) score[i] = forced_score;
          return selector->select(static_cast<int>(r.layer), r.selected, score);
        };
      }
      std::vector<kvfuse::TokenSet> per_layer;
      kvfuse::LlamaKVCache work = merged;
      const kvfuse::SelectionPolicy counting = [&](const kvfuse::LayerReport& r) {
        per_layer.push_back(r.selected);
        return policy ? policy(r) : r.selected;
      };
      const kvfuse::PartialPrefillResult res = model.partial_prefill(tokens, work, initial, counting);
      for (const kvfuse::TokenSet& c : per_layer) computed += static_cast<std::int64_t>(c.size());
      // Per layer, squared V deviation from full prefill: of the recomputed chunk rows after recomputation
      // ("fresh") and as loaded ("stale"), and of the query rows.
      nlohmann::json layers = nlohmann::json::array();
      const auto v_dev = [&](const kvfuse::LlamaKVCache& rows, std::int64_t l, std::int64_t t) {
        double d = 0;
        for (std::int64_t i = 0; i < dim; ++i) d += std::pow(rows.v_row(l, t)[i] - full.kv.v_row(l, t)[i], 2);
        return d;
      };
      for (std::int64_t l = 0; l < L; ++l) {
        double fresh = 0, stale = 0, query = 0;
        std::int64_t count = 0;
        for (std::int64_t t : per_layer[static_cast<std::size_t>(l)]) {
          if (layout.query.contains(t)) {
            query += v_dev(work, l, t) / static_cast<double>(layout.query.size());
          } else if (t >= layout.chunks.front().range.end) {
            fresh += v_dev(work, l, t);
            stale += v_dev(merged, l, t);
            ++count;
          }
        }
        layers.push_back({{"rows", count}, {"fresh", count ? fresh / count : 0.0}, {"stale", count ? stale / count : 0.0},
                          {"query", query}});
      }
      const std::vector<std::vector<float>> forced = model.forced_logits(work, res.logits, answer);
      const kvfuse::eval::TeacherForced tf = kvfuse::eval::teacher_forced(reference, forced);
      const double first = kvfuse::eval::kl_divergence(full.logits, res.logits);
      // Rows computed over all layers relative to full prefill's n · L.
      const double recomputed = static_cast<double>(computed) / static_cast<double>(n * L);
      qj["methods"][name] = per_token(forced);
      qj["methods"][name].update({{"kl_answer_mean", tf.kl_mean}, {"top1", tf.top1_agreement},
                                  {"kl_first_token", first}, {"compute_fraction", recomputed},
                                  {"v_deviation_per_layer", layers},
                                  {"max_abs_logit_diff_vs_full", [&] {
                                     double d = 0;
                                     for (std::size_t i = 0; i < res.logits.size(); ++i)
                                       d = std::max<double>(d, std::fabs(res.logits[i] - full.logits[i]));
                                     return d;
                                   }()}});
      add(name, tf, first, recomputed);
    }
    out["per_question"].push_back(qj);
    fmt::print(stderr, "-- question done ({} tokens)\n", n);
  }
  for (const auto& [name, s] : kl_sum)
    out["means"][name] = {{"kl_answer_mean", s[0] / limit}, {"kl_first_token", s[1] / limit},
                          {"compute_fraction", s[2] / limit}, {"top1", s[3] / limit}};
  fmt::print("{}\n", out.dump(1));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "kvfuse-fidelity-probe: {}\n", e.what());
  return 2;
}
