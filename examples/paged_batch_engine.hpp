#pragma once
// PagedBatchEngine: the toy paged engine (paged_engine.hpp) as an engine that owns its step loop, the shape of
// CpuBatchEngine (kvfuse/backend/cpu/batch_engine.hpp) in a few lines: several requests' KV in one shared pool of
// 16-row pages (one block table per request), one forward step over a batch of requests, and kvfuse's fusion
// methods through FusionConnector's request-keyed hooks (kvfuse/fusion/connector.hpp), called as a GPU engine
// calls them. docs/integration.md §6 walks through it; tests/unit/paged_batch.cpp checks it bit for bit.
//
//   admit(tokens, layout, method)  scheduler side: FusionConnector::plan, pages from the free list, start (loads begin)
//   step()                         every admitted request not yet prefilled, one CpuLlama::forward over the batch:
//                                  per request and layer, wait_for_layer's pieces installed into that layer's rows
//                                  (K RoPE-shifted to the rows' positions), after_layer when the plan is per-layer
//   finish(request)                its pages back to the pool (also for a request cancelled before its step)
// Cache-Craft (cachecraft requests) through the public VariantBook (kvfuse/fusion/variant_book.hpp), as an engine
// outside kvfuse keeps its variants: plans choose from the book; a request that computes a reusable chunk on every
// layer collects its attention statistics in after_layer and, when its prefill ends, saves each new variant's KV
// through the connector and admits it once the save is done; a variant whose read failed is forgotten.
// A failed read stays with its request: step() reports its status, the other requests of the batch are untouched,
// and its plan is recovered (FusionConnector::recover: the failed chunks computed instead) for the next step.
//
// Block format: the connector hands over the stored bytes a layer at a time as they are, so this engine reads
// CpuLlamaFusion's format (fp32; per layer, the K rows then the V rows) under CpuLlamaFusion's fingerprint: its
// chunk caches are the ones FusionPipeline::store_chunk_caches stores over CpuLlamaFusion. (PagedEngine keeps its
// own row-major format under a salted fingerprint; neither engine is ever handed the other's blocks.)
// Borrowed math, as in PagedEngine: the step gathers each request's pages into a LlamaKVCache, the forward pass and
// the installs run on that copy, and the rows are scattered back; a real engine's kernels work on the pages.
// Every row ends at its own position (loaded K is shifted there), so the pages keep no positions.
//
// Not thread-safe: the engine's loop calls it. The model and the store must outlive the engine.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/cpu/llama.hpp"
#include "kvfuse/backend/cpu_llama.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/fusion/connector.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/variant_book.hpp"

namespace kvfuse_example {

template <kvfuse::RangedKVStore Store>
class PagedBatchEngine {
 public:
  static constexpr std::int64_t kPageRows = 16;  // rows per page (vLLM: block_size)

  struct StepResult {
    std::uint64_t request = 0;
    kvfuse::Status status = kvfuse::Status::success;  // otherwise its read failed: it prefills again next step
    std::vector<float> logits;                        // of the prompt's last row, on success
  };

  // A pool of `pages` pages shared by every request; Cache-Craft's variants in an N x M VariantCache (§3.3).
  PagedBatchEngine(const kvfuse::CpuLlama& model, Store& store, std::int64_t pages, kvfuse::ConnectorConfig config = {},
                   kvfuse::VariantCacheConfig variants = {})
      : model_(&model),
        store_(&store),
        // fp32 storage: the stored blocks carry the model's own fingerprint
        shape_(kvfuse::engine_shape(kvfuse::CpuLlamaFusion(model))),
        connector_(store, shape_, config),
        variants_(variants),
        pool_(static_cast<std::size_t>(pages) * page_floats()) {
    for (std::int64_t p = pages - 1; p >= 0; --p) free_.push_back(p);  // handed out from the back: page 0 first
  }

  // Plans the request, takes its pages and starts its loads; its id. Throws kvfuse::error for a bad prompt, a
  // plan the connector refuses or too few free pages.
  std::uint64_t admit(std::span<const kvfuse::token_id> tokens, const kvfuse::PromptLayout& layout,
                      kvfuse::FusionMethod method) {
    const std::uint64_t id = next_id_++;
    Request r{{tokens.begin(), tokens.end()}, layout, std::move(method)};
    const auto pages = static_cast<std::size_t>((static_cast<std::int64_t>(tokens.size()) + kPageRows - 1) / kPageRows);
    kvfuse::require(pages <= free_.size(), "PagedBatchEngine::admit: {} rows need {} pages, {} are free",
                    tokens.size(), pages, free_.size());
    r.plan = connector_.plan(id, tokens, layout, r.method, variants_.index());
    variants_.record_uses(r.plan);  // f_r += 1/CFO (Cache-Craft §3.3)
    start(r);
    while (r.block_table.size() < pages) {
      r.block_table.push_back(free_.back());
      free_.pop_back();
    }
    zero(r);  // a page keeps its last request's rows until then
    requests_.emplace(id, std::move(r));
    return id;
  }

  // One forward step over every admitted request not yet prefilled; a result per request of the batch.
  std::vector<StepResult> step() {
    std::vector<std::uint64_t> ids;
    for (const auto& [id, r] : requests_)
      if (!r.prefilled) ids.push_back(id);
    if (ids.empty()) return {};
    std::vector<kvfuse::LlamaKVCache> kv(ids.size());
    std::vector<kvfuse::BatchItem> items(ids.size());
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Request& r = requests_.at(ids[i]);
      kv[i] = gather(r);
      r.initial_tokens.clear();
      for (const std::int64_t row : r.plan.initial) r.initial_tokens.push_back(r.tokens[static_cast<std::size_t>(row)]);
      const kvfuse::StatisticsNeeds& needs = r.plan.statistics;  // only what the plan's policy reads
      items[i].kv = &kv[i];
      items[i].rows = r.plan.initial;
      items[i].tokens = r.initial_tokens;
      items[i].needs = {r.plan.per_layer, needs.k_deviation, needs.v_deviation,
                        needs.chunk_mass || needs.self_mass ? &r.plan.layout : nullptr,
                        needs.query_mass ? r.plan.layout.query : kvfuse::TokenRange{}};
      if (r.collects) {  // the statistics that make its computed chunks Cache-Craft variants
        items[i].needs.after_layer = true;
        items[i].needs.groups = &r.plan.layout;
      }
    }
    Hooks hooks(*this, ids, kv);
    model_->forward(items, hooks);
    std::vector<StepResult> results;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      Request& r = requests_.at(ids[i]);
      if (items[i].status == kvfuse::Status::success) {
        scatter(kv[i], r);
        r.prefilled = true;
        connector_.finish(ids[i]);  // its loads are done; its pages keep its KV until finish()
        save_variants(r, kv[i]);
      } else {
        for (const std::size_t j : connector_.failure(ids[i]).chunks) variants_.forget(r.plan.chunks[j]);
        r.plan = connector_.recover(ids[i], r.method);  // the failed chunks computed instead
        zero(r);                                         // its rows start over, as a new request's
        start(r);
      }
      results.push_back({ids[i], items[i].status, std::move(items[i].logits)});
    }
    return results;
  }

  // The request is done (or cancelled): its pages go back to the pool.
  void finish(std::uint64_t request) {
    const auto it = requests_.find(request);
    if (it == requests_.end()) return;
    connector_.finish(request);
    free_.insert(free_.end(), it->second.block_table.rbegin(), it->second.block_table.rend());
    requests_.erase(it);
  }

  [[nodiscard]] std::size_t free_pages() const noexcept { return free_.size(); }
  // Cache-Craft's variants whose KV is stored.
  [[nodiscard]] const kvfuse::VariantCache& variants() const noexcept { return variants_.cache(); }
  [[nodiscard]] const std::vector<std::int64_t>& block_table(std::uint64_t request) const {
    return requests_.at(request).block_table;
  }
  // The request's KV from its pages (to compare with CpuLlamaFusion's).
  [[nodiscard]] kvfuse::LlamaKVCache gather(std::uint64_t request) const { return gather(requests_.at(request)); }

 private:
  struct Request {
    std::vector<kvfuse::token_id> tokens;
    kvfuse::PromptLayout layout;
    kvfuse::FusionMethod method;
    kvfuse::FusionPlan plan{};
    std::vector<std::int64_t> block_table{};         // request page -> pool page
    std::vector<kvfuse::token_id> initial_tokens{};  // the token of each row of S_0 (BatchItem::tokens)
    bool prefilled = false;
    bool collects = false;                           // VariantBook::collects_variants
    std::vector<kvfuse::LayerAttention> attention{}; // when collecting: each layer's statistics over the layout's
    std::vector<kvfuse::TokenSet> attended{};        // chunks, and S_l
  };

  // The engine's side of the per-layer hooks, item i being request ids[i] with its gathered KV kv[i].
  struct Hooks final : kvfuse::StepHooks {
    PagedBatchEngine& e;
    std::span<const std::uint64_t> ids;
    std::span<kvfuse::LlamaKVCache> kv;
    Hooks(PagedBatchEngine& engine, std::span<const std::uint64_t> requests, std::span<kvfuse::LlamaKVCache> caches)
        : e(engine), ids(requests), kv(caches) {}
    kvfuse::Status before_layer(std::size_t item, std::int64_t layer) override {
      const kvfuse::LayerLoad load = e.connector_.wait_for_layer(ids[item], layer);
      for (const kvfuse::LayerPiece& p : load.pieces) e.install(kv[item], layer, p);  // none when it failed
      return load.status;
    }
    kvfuse::Status after_layer(std::size_t item, const kvfuse::LayerReport& report, kvfuse::TokenSet& next) override {
      if (Request& r = e.requests_.at(ids[item]); r.collects && report.attention != nullptr) {
        r.attention.push_back(*report.attention);
        r.attended.push_back(report.selected);
      }
      return e.connector_.after_layer(ids[item], report, next);
    }
  };

  [[nodiscard]] std::int64_t num_layers() const { return model_->config().n_layer; }
  [[nodiscard]] std::int64_t kv_dim() const { return model_->config().kv_dim(); }
  [[nodiscard]] std::size_t page_floats() const {
    return static_cast<std::size_t>(num_layers() * 2 * kPageRows * kv_dim());
  }

  // Where K (kv = 0) or V (kv = 1) of the request's `row` on `layer` lives: each page is [layer][K | V][16][kv_dim].
  [[nodiscard]] std::size_t offset(const Request& r, std::int64_t row, std::int64_t layer, int kv) const {
    const std::int64_t page = r.block_table[static_cast<std::size_t>(row / kPageRows)];
    const std::int64_t slot = ((page * num_layers() + layer) * 2 + kv) * kPageRows + row % kPageRows;
    return static_cast<std::size_t>(slot * kv_dim());
  }

  void start(Request& r) {
    r.collects = kvfuse::VariantBook::collects_variants(r.method, r.layout, r.plan);
    r.attention.clear();
    r.attended.clear();
    const kvfuse::Status s = connector_.start(r.plan, r.method);
    kvfuse::require_code(s == kvfuse::Status::success, s, "PagedBatchEngine: {}", kvfuse::last_status_message());
  }

  // Its prefill is done: each new variant's KV saved through the connector (CpuLlamaFusion's fp32 format: the rows'
  // LlamaKVCache block), admitted once stored. A real engine would collect the saves a step later instead of waiting.
  void save_variants(Request& r, const kvfuse::LlamaKVCache& kv) {
    if (!r.collects) return;
    std::vector<kvfuse::NewVariant> made =
        kvfuse::VariantBook::new_variants(r.tokens, r.layout, r.plan, r.attention, r.attended, shape_.model);
    for (const kvfuse::NewVariant& v : made) connector_.save(v.key, kv.to_block(v.rows));
    connector_.wait_for_saves();
    for (const kvfuse::SaveResult& saved : connector_.finished_saves())
      for (kvfuse::NewVariant& v : made)
        if (saved.status == kvfuse::Status::success && saved.key == v.key)
          variants_.admit(v.profile, v.key, v.rows.begin, *store_);
    r.collects = false;
    r.attention.clear();
    r.attended.clear();
  }

  void zero(const Request& r) {
    for (const std::int64_t page : r.block_table)
      std::fill_n(pool_.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(page) * page_floats()),
                  page_floats(), 0.0f);
  }

  // Layer `layer` of a loaded chunk into its rows: the K rows then the V rows, K then rotated from the stored
  // positions to the rows' own (by rows.begin − stored_first_position).
  void install(kvfuse::LlamaKVCache& kv, std::int64_t layer, const kvfuse::LayerPiece& p) const {
    const std::size_t half = p.bytes.size() / 2;
    std::memcpy(kv.k_row(layer, p.rows.begin), p.bytes.data(), half);
    std::memcpy(kv.v_row(layer, p.rows.begin), p.bytes.data() + half, half);
    if (p.rows.begin != p.stored_first_position)
      model_->rope_shift_layer(kv, layer, p.rows, p.rows.begin - p.stored_first_position);
  }

  [[nodiscard]] kvfuse::LlamaKVCache gather(const Request& r) const {
    const auto n = static_cast<std::int64_t>(r.tokens.size());
    kvfuse::LlamaKVCache kv(num_layers(), kv_dim(), n);  // row t at position t
    for (std::int64_t row = 0; row < n; ++row)
      for (std::int64_t l = 0; l < num_layers(); ++l) {
        std::copy_n(pool_.data() + offset(r, row, l, 0), kv_dim(), kv.k_row(l, row));
        std::copy_n(pool_.data() + offset(r, row, l, 1), kv_dim(), kv.v_row(l, row));
      }
    return kv;
  }

  void scatter(const kvfuse::LlamaKVCache& kv, const Request& r) {
    for (std::int64_t row = 0; row < kv.num_rows(); ++row)
      for (std::int64_t l = 0; l < num_layers(); ++l) {
        std::copy_n(kv.k_row(l, row), kv_dim(), pool_.data() + offset(r, row, l, 0));
        std::copy_n(kv.v_row(l, row), kv_dim(), pool_.data() + offset(r, row, l, 1));
      }
  }

  const kvfuse::CpuLlama* model_;
  Store* store_;                      // where the KV of variants the book evicts is erased
  kvfuse::EngineShape shape_;
  kvfuse::FusionConnector<Store> connector_;
  kvfuse::VariantBook variants_;      // Cache-Craft's variants of cachecraft requests
  std::vector<float> pool_;           // every page of every request
  std::vector<std::int64_t> free_;    // pages no request holds
  std::map<std::uint64_t, Request> requests_;
  std::uint64_t next_id_ = 1;
};

}  // namespace kvfuse_example
