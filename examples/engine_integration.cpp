// kvfuse-engine-integration: kvfuse's fusion loop seen from an engine (docs/integration.md walks through it).
//
// A toy paged engine (paged_engine.hpp) on a small random-weights Llama, chunk caches in an InMemoryKVStore,
// and every fusion method on one RAG prompt [system, passage 1, passage 2, passage 3, query], each compared
// with full prefill of the same prompt. Per method it prints where each chunk's KV came from, the fraction of
// (layer, token) rows recomputed, and the max |logit − full-prefill logit|; for Cache-Craft with focus
// termination also L* and F*, the focused chunks among those whose tokens are being fixed. Then the same toy with
// its own step loop (paged_batch_engine.hpp): three requests in one batched step over one pool of pages, each
// request's logits compared with FusionPipeline::run of it alone on CpuLlamaFusion.
//
// Exit status 1 if full prefill through the pipeline or 100 % recompute (cacheblend@1) differs from full
// prefill in any bit, any method's logits are not finite, or a batched request's logits differ from its run
// alone; 2 on an error (kvfuse::error).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kvfuse/cpu.hpp"
#include "paged_batch_engine.hpp"
#include "paged_engine.hpp"

namespace {

using kvfuse::token_id;

constexpr std::uint32_t kVocab = 96;

// n deterministic token ids: stands in for a tokenized passage.
std::vector<token_id> text(std::size_t n, std::uint32_t seed) {
  std::vector<token_id> t(n);
  for (std::size_t i = 0; i < n; ++i)
    t[i] = static_cast<token_id>((seed * 2654435761u + 31u * i * i + 7u * i) % kVocab);
  return t;
}

struct Prompt {
  std::vector<token_id> tokens;
  kvfuse::PromptLayout layout;  // which tokens are which chunk, and the query
};

Prompt assemble(const std::vector<std::vector<token_id>>& chunks, const std::vector<token_id>& query) {
  Prompt p;
  std::vector<std::int64_t> lengths;
  for (const auto& c : chunks) {
    p.tokens.insert(p.tokens.end(), c.begin(), c.end());
    lengths.push_back(static_cast<std::int64_t>(c.size()));
  }
  p.tokens.insert(p.tokens.end(), query.begin(), query.end());
  p.layout = kvfuse::PromptLayout::from_lengths(lengths, static_cast<std::int64_t>(query.size()));
  return p;
}

const char* source_name(kvfuse::KVSource s) {
  switch (s) {
    case kvfuse::KVSource::compute: return "compute";
    case kvfuse::KVSource::prefix: return "prefix";
    case kvfuse::KVSource::isolated: return "isolated";
    case kvfuse::KVSource::variant: return "variant";
  }
  return "?";
}

}  // namespace

int main() try {
  // The model: a small Llama with random weights (CpuLlama::from_gguf loads a real one the same way).
  kvfuse::LlamaConfig config;
  config.n_layer = 6;
  config.n_embd = 32;
  config.n_head = 4;
  config.n_head_kv = 2;
  config.head_dim = 8;
  config.n_ff = 64;
  config.n_vocab = kVocab;
  config.rope_base = 10000.0;
  config.rms_eps = 1e-5;
  const kvfuse::CpuLlama model(config, kvfuse::LlamaWeights::random(config, 5), kvfuse::CpuLlamaOptions{2, 8});

  // The engine, the store and the pipeline that drives the engine.
  kvfuse_example::PagedEngine engine(model);
  kvfuse::InMemoryKVStore store;
  kvfuse::FusionPipeline pipeline(engine, store);

  // This request's prompt, and an earlier one: the same system prompt, a passage this request does not have,
  // then passages 1, 3, 2. From its KV, prefix caching can reuse the system prompt only (the rest followed other
  // tokens); Cache-Craft keeps every chunk's in-context KV as a variant and recomputes some tokens of each chunk
  // whose context changed (Cache-Craft §3.2).
  const auto system = text(8, 1), p1 = text(40, 2), p2 = text(36, 3), p3 = text(44, 4);
  const Prompt prompt = assemble({system, p1, p2, p3}, text(8, 5));
  const Prompt earlier = assemble({system, text(24, 6), p1, p3, p2}, text(6, 9));

  // Offline: each chunk's own cache (at position 0), and the earlier prompt's in-context KV.
  const std::int64_t stored = pipeline.store_chunk_caches(prompt.tokens, prompt.layout);
  pipeline.record_context(earlier.tokens, earlier.layout);
  fmt::print("PagedEngine: {} prompt rows in pages of {}; store: {} chunk caches computed, {} blocks, {} bytes; "
             "{} Cache-Craft variants\n\n",
             prompt.tokens.size(), kvfuse_example::PagedEngine::kPageRows, stored, store.size(), store.bytes(),
             pipeline.variants().size());

  // The reference: full prefill of the prompt, every token on every layer.
  const std::vector<float> full = model.full_prefill(prompt.tokens).logits;

  bool ok = true;
  fmt::print("{:<20} {:<40} {:>10} {:>14}\n", "method", "sources (system, passages 1-3)", "recomputed",
             "max |dlogit|");
  for (const char* name :
       {"full", "cacheblend@1", "prefix", "naive", "cacheblend", "attnlink", "cachecraft", "cachecraft-nofocus",
        "queryaware"}) {
    const kvfuse::FusionResult r = pipeline.run(prompt.tokens, prompt.layout, kvfuse::parse_method(name));
    std::string sources;
    for (const kvfuse::ChunkPlan& c : r.plan.chunks) sources += fmt::format("{:<10}", source_name(c.source));
    float diff = 0.0f;
    bool finite = r.logits.size() == full.size();
    for (std::size_t i = 0; finite && i < full.size(); ++i) {
      finite = std::isfinite(r.logits[i]);
      diff = std::max(diff, std::abs(r.logits[i] - full[i]));
    }
    fmt::print("{:<20} {:<40} {:>8.1f} % {:>14.3g}\n", name, sources, 100.0 * r.recompute_fraction, diff);
    if (r.focus) {  // Cache-Craft's focus termination (Algorithm 1): from layer L* on, only F*'s tokens are fixed
      std::vector<std::size_t> fixing;  // the chunks whose tokens are being fixed: the candidates
      for (std::size_t j = 0; j < r.plan.chunks.size(); ++j)
        if (!r.plan.chunks[j].recompute.empty()) fixing.push_back(j);
      fmt::print("{:<20} L* = {}, F* = chunks {} of {}{}\n", "", r.focus->cutoff_layer, r.focus->focused, fixing,
                 r.focus->stabilised ? "" : " (not stabilised)");
    }
    const bool exact_expected = std::string(name) == "full" || std::string(name) == "cacheblend@1";
    if (!finite || (exact_expected && r.logits != full)) {
      fmt::print(stderr, "kvfuse-engine-integration: {}: {}\n", name,
                 finite ? "logits differ from full prefill" : "logits are not finite");
      ok = false;
    }
  }

  // Several requests in one step: their KV in one shared pool of pages, one forward pass over the batch through
  // FusionConnector's hooks. This engine reads CpuLlamaFusion's block format, so its chunk caches are
  // CpuLlamaFusion's, in a store of their own; FusionPipeline::run on CpuLlamaFusion is the reference.
  kvfuse::InMemoryKVStore flat_store;
  kvfuse::CpuLlamaFusion flat(model);
  kvfuse::FusionPipeline reference(flat, flat_store);
  const Prompt third = assemble({system, p3, p1}, text(8, 7));
  const std::vector<std::pair<const Prompt*, const char*>> batch = {
      {&prompt, "cacheblend"}, {&earlier, "queryaware"}, {&third, "attnlink"}};
  kvfuse_example::PagedBatchEngine<kvfuse::InMemoryKVStore> batched(model, flat_store, 32);
  std::vector<std::uint64_t> ids;
  for (const auto& [p, method] : batch) {
    reference.store_chunk_caches(p->tokens, p->layout);
    ids.push_back(batched.admit(p->tokens, p->layout, kvfuse::parse_method(method)));
  }
  fmt::print("\nPagedBatchEngine: {} requests admitted to one pool of 32 pages ({} left free), one step:\n", ids.size(),
             batched.free_pages());
  const auto results = batched.step();
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& [p, method] = batch[i];
    const bool same = results[i].status == kvfuse::Status::success &&
                      results[i].logits == reference.run(p->tokens, p->layout, kvfuse::parse_method(method)).logits;
    fmt::print("request {} {:<11} {:>3} rows on pages {}: logits {} FusionPipeline::run alone\n", results[i].request,
               method, p->tokens.size(), batched.block_table(ids[i]), same ? "==" : "!=");
    ok = ok && same;
  }
  for (const std::uint64_t id : ids) batched.finish(id);
  fmt::print("finished: {} of 32 pages free\n", batched.free_pages());
  return ok ? 0 : 1;
} catch (const std::exception& e) {  // kvfuse::error names the bad value
  fmt::print(stderr, "kvfuse-engine-integration: {}\n", e.what());
  return 2;
}
