#pragma once
// PagedEngine: a toy serving engine that plugs its own paged KV cache into kvfuse's fusion loop
// (kvfuse::FusionPipeline). It models both engine concepts of kvfuse/fusion/fusion_backend.hpp:
// FixedSetFusionBackend and its refinement PerLayerFusionBackend, so every fusion method runs on it.
// docs/integration.md walks through this file; examples/engine_integration.cpp runs it, and
// tests/unit/fusion_pipeline.cpp checks it against CpuLlamaFusion bit for bit.
//
// What is the engine's own here is the KV layout and the calls, as a vLLM KV connector sees them:
//   - one pool of pages of 16 rows (vLLM's default block size); a request's rows reach their pages through a
//     block table, page = block_table[row / 16] (handed out in a scrambled order, as an allocator would);
//     each page holds [layer][K | V][16 rows][kv_dim] floats;
//   - its own KVBlock format for the store: row-major (row, layer, K then V), not the CPU backend's;
//   - its own model fingerprint (the model's, salted): a block in this format must never be read by an engine
//     with another layout, and every store key carries the fingerprint.
// What is not its own: the forward pass. It gathers its pages into a kvfuse::LlamaKVCache and runs CpuLlama's
// math (prefill_chunk, rope_shift, partial_prefill), then scatters the result back into its pages. A real
// engine runs its own kernels on its own pages here (kvfuse::cuda has RoPE shift, sparse-query attention,
// KV deviation and paged KV scatter / gather for that); the point of the toy is the layout and the calls.
//
// Not thread-safe; one request at a time (paged_batch_engine.hpp: several, batched in one step). The model must
// outlive the engine.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "kvfuse/backend/cpu_llama.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/fusion/fusion_backend.hpp"

namespace kvfuse_example {

class PagedEngine {
 public:
  static constexpr std::int64_t kPageRows = 16;  // rows per page (vLLM: block_size)

  explicit PagedEngine(const kvfuse::CpuLlama& model) : model_(&model) {}

  // Part of every store key. Salted with this engine's layout: the same model's KV in another engine's
  // block format gets other keys, so neither engine is ever handed the other's blocks.
  [[nodiscard]] std::uint64_t model_fingerprint() const { return model_->fingerprint() ^ 0x9a6edull; }
  [[nodiscard]] std::int64_t num_layers() const { return model_->config().n_layer; }
  // Size of one stored block of `rows` rows in this engine's format; the pipeline refuses blocks of any other.
  [[nodiscard]] std::size_t block_bytes(std::int64_t rows) const {
    return static_cast<std::size_t>(rows * num_layers() * 2 * kv_dim()) * sizeof(float);
  }

  // Offline: a chunk cache — the chunk prefilled alone at positions first_position, first_position + 1, ...,
  // encoded in this engine's block format.
  [[nodiscard]] kvfuse::KVBlock chunk_kv(std::span<const kvfuse::token_id> tokens, std::int64_t first_position) const {
    const kvfuse::LlamaKVCache kv = model_->prefill_chunk(tokens, first_position);
    return encode(kv, {0, kv.num_rows()}, first_position);
  }

  // A new request: allocate its pages and fill its block table (in vLLM, the KV cache manager does this when
  // the scheduler admits the request). No row is resident yet; row t is at position t until a load moves it.
  void begin(std::span<const kvfuse::token_id> tokens) {
    tokens_.assign(tokens.begin(), tokens.end());
    const auto n = static_cast<std::int64_t>(tokens.size());
    const std::int64_t pages = (n + kPageRows - 1) / kPageRows;
    block_table_.resize(static_cast<std::size_t>(pages));
    for (std::int64_t p = 0; p < pages; ++p) block_table_[static_cast<std::size_t>(p)] = (p * 7 + 3) % pages;
    pool_.assign(static_cast<std::size_t>(pages * kPageRows * num_layers() * 2 * kv_dim()), 0.0f);
    positions_.resize(static_cast<std::size_t>(n));
    std::iota(positions_.begin(), positions_.end(), std::int64_t{0});
  }

  // Stored KV for rows r: decode the block into the rows' page slots (in vLLM, the connector's start_load_kv
  // into the request's blocks). K stays rotated at the block's positions until shift_rows moves it.
  void load_rows(kvfuse::TokenRange r, const kvfuse::KVBlock& block) {
    kvfuse::require(block.bytes.size() == block_bytes(r.size()),
                            "PagedEngine::load_rows: the block for rows {} holds {} bytes, expected {}", r,
                            block.bytes.size(), block_bytes(r.size()));
    const float* in = reinterpret_cast<const float*>(block.bytes.data());
    for (std::int64_t row = r.begin; row < r.end; ++row) {
      positions_[static_cast<std::size_t>(row)] = block.first_position + (row - r.begin);
      for (std::int64_t l = 0; l < num_layers(); ++l)
        for (int kv = 0; kv < 2; ++kv, in += kv_dim()) std::copy_n(in, kv_dim(), slot(row, l, kv));
    }
  }

  // Move loaded K of rows r by delta positions on every layer: one RoPE rotation by new − old.
  void shift_rows(kvfuse::TokenRange r, std::int64_t delta) {
    kvfuse::LlamaKVCache kv = gather();
    model_->rope_shift(kv, r, delta);
    scatter(kv);
  }

  // Fixed set: recompute `rows` on every layer against the resident KV, the rest keep theirs.
  std::vector<float> prefill(const kvfuse::TokenSet& rows) { return prefill(rows, {}, {}); }

  // Per layer: S_0 = rows; after layer l, report deviations (and the statistics `stats` asks for: attention over
  // its groups, the query's attention mass) to `next`, whose answer is S_{l+1}. Returns the last row's logits.
  std::vector<float> prefill(const kvfuse::TokenSet& rows, const kvfuse::SelectionPolicy& next,
                             const kvfuse::StatisticsRequest& stats) {
    kvfuse::LlamaKVCache kv = gather();
    kvfuse::PartialPrefillOptions options;
    options.attention_groups = stats.groups;
    options.query_mass_rows = stats.query;
    std::vector<float> logits = model_->partial_prefill(tokens_, kv, rows, next, options).logits;
    scatter(kv);
    return logits;
  }

  // The resident KV of rows r in this engine's block format, to store (prefix entries, Cache-Craft variants);
  // in vLLM, the connector's save_kv_layer, here for every layer at once.
  [[nodiscard]] kvfuse::KVBlock save_rows(kvfuse::TokenRange r) const {
    return encode(gather(), r, positions_[static_cast<std::size_t>(r.begin)]);
  }

  // The request's KV in LlamaKVCache form (for the forward pass, and to compare with CpuLlamaFusion's).
  [[nodiscard]] kvfuse::LlamaKVCache gather() const {
    const auto n = static_cast<std::int64_t>(positions_.size());
    kvfuse::LlamaKVCache kv(num_layers(), kv_dim(), n);
    kv.positions = positions_;
    for (std::int64_t row = 0; row < n; ++row)
      for (std::int64_t l = 0; l < num_layers(); ++l) {
        std::copy_n(slot(row, l, 0), kv_dim(), kv.k[static_cast<std::size_t>(l)].data() + row * kv_dim());
        std::copy_n(slot(row, l, 1), kv_dim(), kv.v[static_cast<std::size_t>(l)].data() + row * kv_dim());
      }
    return kv;
  }

 private:
  [[nodiscard]] std::int64_t kv_dim() const { return model_->config().kv_dim(); }

  // Where K (kv = 0) or V (kv = 1) of `row` on `layer` lives: the row's page through the block table.
  [[nodiscard]] std::size_t offset(std::int64_t row, std::int64_t layer, int kv) const {
    const std::int64_t page = block_table_[static_cast<std::size_t>(row / kPageRows)];
    const std::int64_t row_in_page = row % kPageRows;
    return static_cast<std::size_t>((((page * num_layers() + layer) * 2 + kv) * kPageRows + row_in_page) * kv_dim());
  }
  [[nodiscard]] float* slot(std::int64_t row, std::int64_t layer, int kv) {
    return pool_.data() + offset(row, layer, kv);
  }
  [[nodiscard]] const float* slot(std::int64_t row, std::int64_t layer, int kv) const {
    return pool_.data() + offset(row, layer, kv);
  }

  void scatter(const kvfuse::LlamaKVCache& kv) {
    positions_ = kv.positions;
    for (std::int64_t row = 0; row < kv.num_rows(); ++row)
      for (std::int64_t l = 0; l < num_layers(); ++l) {
        std::copy_n(kv.k[static_cast<std::size_t>(l)].data() + row * kv_dim(), kv_dim(), slot(row, l, 0));
        std::copy_n(kv.v[static_cast<std::size_t>(l)].data() + row * kv_dim(), kv_dim(), slot(row, l, 1));
      }
  }

  // This engine's block format: for each row, for each layer, K then V (kv_dim floats each).
  [[nodiscard]] kvfuse::KVBlock encode(const kvfuse::LlamaKVCache& kv, kvfuse::TokenRange r,
                                       std::int64_t first_position) const {
    kvfuse::KVBlock block{r.size(), std::vector<std::byte>(block_bytes(r.size())), first_position};
    auto* out = reinterpret_cast<float*>(block.bytes.data());
    for (std::int64_t row = r.begin; row < r.end; ++row)
      for (std::int64_t l = 0; l < num_layers(); ++l) {
        out = std::copy_n(kv.k[static_cast<std::size_t>(l)].data() + row * kv_dim(), kv_dim(), out);
        out = std::copy_n(kv.v[static_cast<std::size_t>(l)].data() + row * kv_dim(), kv_dim(), out);
      }
    return block;
  }

  const kvfuse::CpuLlama* model_;
  std::vector<kvfuse::token_id> tokens_;
  std::vector<std::int64_t> block_table_;  // request page -> pool page
  std::vector<float> pool_;                // every page: [layer][K | V][kPageRows][kv_dim]
  std::vector<std::int64_t> positions_;    // per row: the position its K is rotated at
};

static_assert(kvfuse::FixedSetFusionBackend<PagedEngine>);
static_assert(kvfuse::PerLayerFusionBackend<PagedEngine>);

}  // namespace kvfuse_example
