#pragma once
// CpuLlama: the reference Llama / Gemma 3 / Qwen2 forward pass on the CPU (fp32; the weight projections optionally
// bf16 on AMX, CpuLlamaOptions::products), with the layer-wise operations
// of the fusion loop every position-independent caching method shares (CacheBlend §4.3, Epic §4.2, Cache-Craft
// §3.2: a layer-wise partial prefill of a selected set S_l over reused chunk KV):
//   full_prefill        all tokens, every layer                                   -> KV + last-token logits
//   prefill_chunk       one chunk in isolation at given positions (a chunk cache)  -> KV
//   rope_shift          move cached K from its positions to new ones: one rotation by Δ = new − old
//   partial_prefill     layer by layer, recompute only the selected set S_l against a merged KV, with the
//                       exact causal mask by position, report KV deviation (and attention statistics),
//                       and let a policy choose S_{l+1} ⊆ S_l                     -> last-token logits
//   extend / greedy_decode   append tokens to a KV (chunked prefill, decoding)
// The model of kvfuse::ComputeBackend built on it, CpuLlamaSession, is in backend/cpu_llama.hpp.
//
// The forward pass (llama.cpp LLM_ARCH_LLAMA):
//   h = token_embd[t]
//   per layer: x = RMSNorm(h) ⊙ attn_norm;  q = W_q x, k = W_k x, v = W_v x;  RoPE(q), RoPE(k) at the
//              token's position;  h += W_o · concat_h softmax(q_h · K_g^T / sqrt(d) + mask) V_g with
//              g = h / (n_head / n_head_kv);
//              x = RMSNorm(h) ⊙ ffn_norm;  h += W_down (silu(W_gate x) ⊙ W_up x)
//   logits = W_out · (RMSNorm(h) ⊙ output_norm), W_out = token_embd when the head is tied.
// RMSNorm(h) = h / sqrt(mean(h²) + eps), the sum of squares taken in double.
// gemma3 (llama.cpp LLM_ARCH_GEMMA3, models/gemma3.cpp) changes, in the same loop:
//   h = token_embd[t] · sqrt(n_embd);  each head of q and of k RMSNormed (⊙ attn_q_norm / attn_k_norm) before
//   RoPE, with layer l's own θ (LlamaConfig::rope_theta(l): rope_base_local on local layers); scores
//   q·k · attention_scale; h += RMSNorm(W_o ·) ⊙ attn_post_norm;  h += RMSNorm(W_down (gelu_tanh(W_gate x) ⊙
//   W_up x)) ⊙ ffn_post_norm;  logits soft-capped when final_logit_softcap is set.
// qwen2 (llama.cpp LLM_ARCH_QWEN2, models/qwen2.cpp) is the llama loop with q = W_q x + bq, k = W_k x + bk,
// v = W_v x + bv and NeoX RoPE pairing.
//
// Attention mask: a query at position p attends to every KV row whose position is <= p, wherever that row
// sits in the cache — the exact causal mask by position; on a local (sliding-window) layer only to rows at
// positions > p − sliding_window as well (LlamaConfig::attention_window). (Public CacheBlend/LMCache code
// aligns the mask to the bottom right, letting a selected token see later keys; kvfuse does not.) Masked
// weights are exact zeros, so a masked row never changes a result as long as its V is finite. Mask and softmax
// are detail/attention.hpp's (attention_visible, attention_softmax_row): the ones the sparse-attention kernel
// and its CPU reference run. RoPE: θ_i from rope_frequencies (core/rope.hpp), the double-angle rotation of
// detail/rope.hpp.
//
// Weights stay in the GGUF file's format (WeightMatrix, backend/cpu/weight_matrix.hpp): a product dequantizes
// W a panel of 16 output features at a time and multiplies all rows of x by it (CpuProducts::bf16: the projections
// packed as bf16 once, at construction); the dense loops (matrix products, softmax) are detail/cpu_kernels.hpp's,
// AVX2 + FMA where the CPU has them whatever the build's flags.
//
// Threads: matrix products are split over output features and attention over (KV head, block of queries) on a
// detail::WorkerPool of CpuLlamaOptions::threads threads. One CpuLlama may be used from several threads at
// once (the const operations do not modify it); concurrent calls share the pool (see worker_pool.hpp).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "kvfuse/backend/cpu/kv_cache.hpp"
#include "kvfuse/backend/cpu/llama_config.hpp"
#include "kvfuse/backend/cpu/worker_pool.hpp"
#include "kvfuse/core/config.hpp"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/prompt.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/detail/cpu_amx.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"

namespace kvfuse {

struct PartialPrefillOptions {
  // When set, every LayerReport carries LayerAttention over these groups (layout.num_tokens() == rows).
  const PromptLayout* attention_groups = nullptr;
  // When not empty, every LayerReport carries query_mass: per row of S_l the softmax weight these rows (all in
  // every S_l) put on it, summed over them and over the query heads (StatisticsRequest::query).
  TokenRange query_mass_rows{};
  // When set, called with l before layer l reads its KV (the layer-pipelined loader installs layer l there).
  LayerHook before_layer;
};

struct PartialPrefillResult {
  std::vector<float> logits;                     // of the last row
  std::vector<std::int64_t> selected_per_layer;  // |S_l|, l = 0 .. L-1
};

struct LlamaPrefill {
  LlamaKVCache kv;
  std::vector<float> logits;  // of the last token
};

// The precision of the weight projections' products (Q, K, V, O, gate, up, down; attention and the output head stay
// fp32). bf16: activations and weights rounded to bf16, products summed in fp32 on Intel AMX (detail/cpu_amx.hpp),
// the projections packed once at construction (2 bytes a weight beside the file's blocks); refused where the CPU has
// no AMX-BF16. Its KV differs from fp32's in the last bits, so the model's fingerprint differs too: a store never
// mixes the two.
enum class CpuProducts { fp32, bf16 };

// "fp32" or "bf16".
[[nodiscard]] inline const char* products_name(CpuProducts p) noexcept {
  return p == CpuProducts::bf16 ? "bf16" : "fp32";
}

// The CpuProducts named "fp32" or "bf16"; anything else is refused, naming it.
[[nodiscard]] inline CpuProducts parse_products(std::string_view name) {
  for (const CpuProducts p : {CpuProducts::fp32, CpuProducts::bf16})
    if (name == products_name(p)) return p;
  throw error(fmt::format("products: '{}' is neither fp32 nor bf16", name));
}

struct CpuLlamaOptions {
  int threads = 0;                // threads of the worker pool, the caller included; 0: hardware_concurrency
  std::int64_t query_block = 64;  // queries per attention task
  // Compute rows at positions >= LlamaConfig::context_length (the trained context) instead of refusing them.
  bool allow_beyond_context = false;
  // full_prefill and prefill_chunk compute their rows in blocks of this many (chunked prefill, as llama.cpp's 512-row
  // batches), so that the activations held at once are a block's, not the prompt's; 0: all rows in one pass. The KV
  // and logits equal one pass's to float rounding (a block's softmax sums its keys in other SIMD lanes). 512 by
  // default: peak memory within 1.5 × llama.cpp's at 6144 tokens (docs/llamacpp.md §2).
  std::int64_t prefill_block_rows = 512;
  CpuProducts products = CpuProducts::fp32;

  void validate() const {
    detail::require(threads >= 0, "CpuLlamaOptions: threads = {} must be >= 0 (0: one per hardware thread)", threads);
    detail::require(query_block >= 1, "CpuLlamaOptions: query_block = {} must be >= 1", query_block);
    detail::require(prefill_block_rows >= 0, "CpuLlamaOptions: prefill_block_rows = {} must be >= 0 (0: one pass)",
                    prefill_block_rows);
    detail::require(products != CpuProducts::bf16 || detail::cpu_uses_amx(),
                    "CpuLlamaOptions: products = bf16 needs Intel AMX-BF16 (Xeon 4th generation or later, Linux "
                    "5.16 or later); this CPU or kernel has not got it (products = fp32 runs anywhere)");
  }
};

// What the forward pass computes for an item besides its rows' KV, so nothing is computed that nobody reads.
struct LayerNeeds {
  bool after_layer = false;              // call StepHooks::after_layer after every layer (a per-layer policy)
  bool k_deviation = false;              // LayerReport::k_deviation (CacheBlend §4.1)
  bool v_deviation = false;              // LayerReport::v_deviation
  const PromptLayout* groups = nullptr;  // LayerReport::attention over these groups (chunk mass, self mass)
  TokenRange query{};                    // LayerReport::query_mass of these rows (QueryAware)
};

// One request's rows in a batched forward step (CpuLlama::forward).
struct BatchItem {
  LlamaKVCache* kv = nullptr;         // the request's KV; rows of `rows` are computed into it
  TokenSet rows;                      // S_0 of this step: sorted rows of *kv, each at its position in kv->positions
  std::span<const token_id> tokens;   // the token of each entry of `rows`
  bool want_logits = true;            // the logits of rows.back(), which every S_l must then keep
  LayerNeeds needs;
  // Results of the step.
  std::vector<float> logits;                     // when want_logits and status == success
  std::vector<std::int64_t> selected_per_layer;  // |S_l| of the layers computed
  Status status = Status::success;               // a hook's status other than success: the item left the step
};

// The per-layer calls a batched forward step makes, per item: the engine-facing side of kvfuse's connector
// (fusion/connector.hpp) or any adapter. Statuses, not exceptions: one item's failure never stops the others.
class StepHooks {
 public:
  // Before layer `layer` reads item `item`'s KV: install what has been loaded for it.
  virtual Status before_layer(std::size_t item, std::int64_t layer) = 0;
  // After the layer, with the statistics the item asked for: S_{l+1} into `next` (empty: keep S_l).
  virtual Status after_layer(std::size_t item, const LayerReport& report, TokenSet& next) = 0;

 protected:
  ~StepHooks() = default;
};

class CpuLlamaSession;

class CpuLlama {
 public:
  CpuLlama(LlamaConfig config, LlamaWeights weights, CpuLlamaOptions options = {})
      : config_(std::move(config)), weights_(std::move(weights)), options_(options) {
    config_.validate();
    weights_.validate(config_);
    options_.validate();
    const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    pool_ = std::make_unique<detail::WorkerPool>(options_.threads == 0 ? static_cast<int>(hw) : options_.threads);
    fingerprint_ = compute_fingerprint();
    if (options_.products == CpuProducts::bf16) pack_projections_bf16();
  }

  // The model in a GGUF file (LlamaConfig::from_gguf, LlamaWeights::from_gguf).
  [[nodiscard]] static CpuLlama from_gguf(const GGUFFile& file, CpuLlamaOptions options = {});

  [[nodiscard]] const LlamaConfig& config() const noexcept { return config_; }
  [[nodiscard]] const LlamaWeights& weights() const noexcept { return weights_; }
  [[nodiscard]] int threads() const noexcept { return pool_->size(); }
  // Queries per attention task (CpuLlamaOptions::query_block): rows computed in chunks that end on multiples of it
  // (but the last) get the bits of one pass, the blocks being the same (CpuBatchEngine's chunked prefill keeps to
  // them).
  [[nodiscard]] std::int64_t query_block() const noexcept { return options_.query_block; }

  // XXH3 (core/hash.hpp) over the config and every weight byte: tells models apart for KVKey::model
  // (backend/concepts.hpp), down to one changed weight (a fine-tune, a damaged file). About 10 ms per 100 MB of
  // weights (SmolLM2 135M Q4_1: 96 MB in 9 ms; docs/reliability.md).
  [[nodiscard]] std::uint64_t fingerprint() const noexcept { return fingerprint_; }

  // An empty cache (0 rows) of this model's shape.
  [[nodiscard]] LlamaKVCache empty_kv() const { return LlamaKVCache(config_.n_layer, config_.kv_dim(), 0); }

  // Chunked prefill of rows r of `kv` (their tokens in `r_tokens`) on every layer, rows [0, r.begin) resident,
  // each row at its position in kv.positions; the logits of row r.end − 1 when `want_logits`, else nothing.
  std::vector<float> compute_rows(LlamaKVCache& kv, TokenRange r, std::span<const token_id> r_tokens,
                                  bool want_logits) const;

  // Prefill of `tokens` at positions 0 .. n-1: the KV of every token and the logits of the last one.
  [[nodiscard]] LlamaPrefill full_prefill(std::span<const token_id> tokens) const;

  // The KV of a chunk computed in isolation (it attends only to itself) at positions
  // first_position .. first_position + n - 1: the chunk cache the fusion methods store. Empty tokens give
  // an empty cache.
  [[nodiscard]] LlamaKVCache prefill_chunk(std::span<const token_id> tokens, std::int64_t first_position) const;

  // Moves the cached K of rows [rows.begin, rows.end) from their positions p to p + delta with one rotation
  // by delta·θ_i on each layer, with that layer's θ_i (detail::rope_cos_sin at Δ, the double angle); V does
  // not depend on position. The new positions must be >= 0.
  void rope_shift(LlamaKVCache& kv, TokenRange rows, std::int64_t delta) const;

  // The rotation of rope_shift on one layer only; positions are left as they are (the layer-pipelined loader
  // shifts each layer as it arrives, into rows already at their prompt positions).
  void rope_shift_layer(LlamaKVCache& kv, std::int64_t layer, TokenRange rows, std::int64_t delta) const;

  // The fusion loop. `merged` holds one row per prompt token (tokens[i] is the token of row i), its K at
  // the row's position, usually cached chunks moved to their prompt positions with rope_shift. Layer by
  // layer l = 0 .. L-1, for the selected rows S_l (S_0 = `initial`):
  //   compute their Q, K, V; report the K and V deviation against the rows' current contents; write their
  //   K, V over those rows; their queries attend to every row at a position <= their own; MLP;
  //   S_{l+1} = policy(report) (an empty policy keeps S_l).
  // Every S_l must be a sorted, duplicate-free subset of S_{l-1} that contains the last row n - 1, whose
  // logits are returned. Rows not in S_l keep their KV on layer l. With every row selected at every layer
  // this is full prefill.
  PartialPrefillResult partial_prefill(std::span<const token_id> tokens, LlamaKVCache& merged, const TokenSet& initial,
                                       const SelectionPolicy& policy, const PartialPrefillOptions& options = {}) const;

  // Chunked prefill / decoding: appends `tokens` to kv at the positions after its highest one (0 for an
  // empty cache), computes them against all of kv, and returns the logits of the last appended token.
  std::vector<float> extend(LlamaKVCache& kv, std::span<const token_id> tokens) const {
    TokenSet rows = append_rows(kv, tokens);
    return run(kv, std::move(rows), tokens, nullptr, nullptr, true, nullptr);
  }

  // extend's first half, for a batched step (forward): appends zero rows for `tokens` at the positions after kv's
  // highest one (0 for an empty cache) and returns their row indices, to be computed.
  TokenSet append_rows(LlamaKVCache& kv, std::span<const token_id> tokens) const;

  // Greedy decoding: the most likely token after `last_logits` (the logits of kv's last token), appended
  // with extend, and so on, until `eos` (not included) or max_new_tokens tokens. kv grows by every
  // generated token but the last. eos < 0 never matches (decode max_new_tokens tokens).
  std::vector<token_id> greedy_decode(LlamaKVCache& kv, std::span<const float> last_logits, std::int64_t max_new_tokens,
                                      token_id eos) const;

  // Teacher forcing: the distributions that predict each of `tokens` after kv's last token (whose logits are
  // `last_logits`), feeding `tokens` themselves, not the model's choices: [last_logits, logits after tokens[0],
  // ..., after tokens[m − 2]]. kv grows by m − 1 tokens (extend, one token at a time, as decoding does).
  std::vector<std::vector<float>> forced_logits(LlamaKVCache& kv, std::span<const float> last_logits,
                                                std::span<const token_id> tokens) const;

 private:
  friend class CpuLlamaSession;

  static TokenSet all_rows(std::int64_t n) {
    TokenSet rows(static_cast<std::size_t>(n));
    std::iota(rows.begin(), rows.end(), std::int64_t{0});
    return rows;
  }

  // Zero KV rows for `tokens` at first_position, first_position + 1, ...
  // (tokens checked against the vocabulary; `what` names the caller in errors).
  [[nodiscard]] LlamaKVCache prefill_kv(std::span<const token_id> tokens, std::int64_t first_position,
                                        const char* what) const;

  // Refuses to compute a row at position `last` (and so a prompt of last + 1 tokens) at or beyond the trained
  // context, unless the options allow it.
  void check_context(std::int64_t last) const;

  void check_tokens(std::span<const token_id> tokens, const char* what) const;

  void check_kv(const LlamaKVCache& kv, const char* what) const;

  // A sorted, duplicate-free set of rows in [0, n).
  static void check_selection(const TokenSet& set, std::int64_t n, const char* what);

  // Tasks to split `work` multiply-adds into: one per pool thread, but a single task (no thread hand-off)
  // below kParallelWork, where waking another thread costs more than it saves.
  static constexpr std::int64_t kParallelWork = std::int64_t{1} << 21;
  [[nodiscard]] std::int64_t tasks_for(std::int64_t work, std::int64_t max_tasks) const noexcept {
    return work < kParallelWork ? 1 : std::max<std::int64_t>(1, std::min<std::int64_t>(pool_->size(), max_tasks));
  }

  // y = x W^T, split over the rows of W (output features) in whole panels: each task packs its rows of W
  // (dequantized) into panels (detail/cpu_kernels.hpp's layout) and multiplies every row of x by them. Up to
  // detail::kRowBlock rows of x (decoding, small batches) a task packs one panel at a time into a buffer of its
  // own and uses it while it is in cache; more rows share `panels` (one buffer per call of run), packed once
  // for every block of rows. Each output is the same chain of multiply-adds either way (gemm_tile's), so the
  // result of a row does not depend on how many rows are multiplied with it. CpuProducts::bf16: project_bf16.
  void project(const RowMatrix& x, const WeightMatrix& w, RowMatrix& y, std::vector<float>& panels) const;
  // project with CpuProducts::bf16: x rounded once (detail::amx_round_row) and multiplied by W's panels packed at
  // construction, each task 32 columns at a time (detail::gemm_bf16: a row's result does not depend on the other rows
  // either).
  void project_bf16(const RowMatrix& x, const WeightMatrix& w, RowMatrix& y) const;
  // bf16_panels_ of every layer's projections (the constructor, CpuProducts::bf16).
  void pack_projections_bf16();

  // Rows to dequantize at once: a panel (pack_weight_rows), a tile of the output head (matvec_rows).
  static constexpr std::int64_t kHeadTile = 64;

  // The packed panels of W^T for rows [r0, r1) of W, dequantized a panel at a time.
  static void pack_weight_rows(const WeightMatrix& w, std::int64_t r0, std::int64_t r1, float* panels);

  // ys[i][j] = W[j] · xs.row(i) for rows j in [r0, r1) of W (the output head) and every row i of xs, W dequantized
  // in registers (detail::gemv_blocks_cpu) or else kHeadTile rows at a time, once for all of xs; each product is
  // detail::gemv's, whatever the other rows.
  static void matvec_rows(const WeightMatrix& w, std::int64_t r0, std::int64_t r1, const RowMatrix& xs,
                          std::span<float* const> ys);

  // y = RMSNorm(x) ⊙ weight, row by row.
  void rms_norm(const RowMatrix& x, const Eigen::VectorXf& weight, RowMatrix& y) const {
    y.resize(x.rows(), x.cols());
    rows_in_parallel(x.rows(), 4 * x.cols(), [&](Eigen::Index i) {  // a square, a scale, a product a value
      y.row(i) = (x.row(i) * rms_scale(x.row(i))).cwiseProduct(weight.transpose());
    });
  }

  // f(i) for every row i in [0, rows), rows of about `row_work` operations each, in contiguous ranges over the
  // pool's threads (one range below kParallelWork in all): each row's result is the same on any thread.
  template <class F>
  void rows_in_parallel(std::int64_t rows, std::int64_t row_work, F&& f) const {
    const std::int64_t tasks = tasks_for(rows * row_work, rows);
    const auto range = [&](std::int64_t t) {
      for (std::int64_t i = rows * t / tasks; i < rows * (t + 1) / tasks; ++i) f(static_cast<Eigen::Index>(i));
    };
    if (tasks == 1) {
      range(0);
    } else {
      pool_->parallel_for(tasks, range);
    }
  }

  // In place, each of the `heads` head vectors of every row: RMSNorm over head_dim ⊙ weight ([head_dim]), the
  // same arithmetic as rms_norm (gemma3's attn_q_norm / attn_k_norm).
  void rms_norm_heads(RowMatrix& x, std::int64_t heads, const Eigen::VectorXf& weight) const;

  // RMSNorm's scale of one vector: 1 / sqrt(mean(v²) + eps), the squares summed in double.
  template <class Vector>
  [[nodiscard]] float rms_scale(const Vector& v) const {
    const double ss = v.template cast<double>().squaredNorm();
    return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(v.size()) + config_.rms_eps));
  }

  // KV rows [begin, end), all of attention group `group` (LayerNeeds::groups: a chunk, or the rest): the group
  // mass of a query sums its weights one run at a time. A forward pass's runs are in row order and disjoint, so each
  // group's sum adds its rows in row order, whatever the runs.
  struct GroupRun {
    std::int64_t begin = 0;
    std::int64_t end = 0;
    std::int64_t group = 0;
  };

  // Attention of the selected rows' queries q ([|sel|][q_dim], rotated) over layer `layer` of kv; writes
  // out ([|sel|][q_dim]), when `group_runs` is set the statistics, and when `query_mass` is set ([|sel|]) the
  // weight the entries `query` of sel put on each selected row, summed over them and over the heads (on a
  // sliding-window layer, without the window: see below), and into row_query_mass ([kv rows]) on every row.
  void attention(std::int64_t layer, const LlamaKVCache& kv, const TokenSet& sel, const RowMatrix& q, RowMatrix& out,
                 const std::vector<GroupRun>* group_runs, std::int64_t num_groups, LayerAttention* stats,
                 TokenRange query, std::vector<float>* query_mass, std::vector<float>* row_query_mass) const;

  // Rows [0, kv.num_rows()) of `kv` (their tokens), in blocks of CpuLlamaOptions::prefill_block_rows; the last row's
  // logits when `want_logits`.
  std::vector<float> compute_all_rows(LlamaKVCache& kv, std::span<const token_id> tokens, bool want_logits) const;

  // The layer loop of one request: run() is forward() over a batch of one, with the std::function policy and hook
  // of the single-request API adapted to StepHooks. Returns the logits of the last row of S_0 when `want_logits`.
  std::vector<float> run(LlamaKVCache& kv, TokenSet sel, std::span<const token_id> sel_tokens,
                         const SelectionPolicy* policy, const PromptLayout* groups, bool want_logits,
                         std::vector<std::int64_t>* sizes, const LayerHook* before_layer = nullptr,
                         TokenRange query_rows = {}) const;

 public:
  // One forward step over a ragged batch (as vLLM flattens the tokens of a step): the rows of every item, each a
  // request with its own KV, concatenated into one matrix product per weight; RoPE, the K / V write and attention
  // per item over its own KV with the exact causal mask by position (rows of other items are never seen). Per
  // item and layer l, hooks.before_layer(i, l) runs before layer l reads item i's KV (a loader installs layer l
  // there) and, when item.needs.after_layer, hooks.after_layer(i, report, next) receives exactly the statistics
  // item.needs names and returns S_{l+1} ⊆ S_l in `next` (left empty: S_l is kept). A hook's status other than
  // success takes that item out of the step from that point (item.status; the KV rows it wrote stay) and leaves the
  // others as they are. Each row's arithmetic does not depend on the other rows of the batch (the matrix products
  // accumulate every output along k in the same order for any number of rows): an item gives the same logits bit
  // for bit alone or batched. Items must not share a KV cache.
  void forward(std::span<BatchItem> items, StepHooks& hooks) const;

 private:

  // XXH3 over the config and every byte of every weight tensor as held (with its type and shape).
  [[nodiscard]] std::uint64_t compute_fingerprint() const noexcept;

  LlamaConfig config_;
  LlamaWeights weights_;
  CpuLlamaOptions options_;
  std::unique_ptr<detail::WorkerPool> pool_;
  std::uint64_t fingerprint_ = 0;
  // CpuProducts::bf16: each layer's projection matrices as AMX panels (detail::amx_pack_transposed), packed once at
  // construction: 2 bytes a weight beside the file's blocks, so that no product dequantizes or packs W again.
  std::vector<std::pair<const WeightMatrix*, std::vector<bf16>>> bf16_panels_;
};

}  // namespace kvfuse

// The member functions' definitions (header-only unless KVFUSE_CPU_SEPARATE_COMPILATION: core/config.hpp).
#ifndef KVFUSE_CPU_SEPARATE_COMPILATION
#include "kvfuse/backend/cpu/llama_impl.hpp"
#endif
