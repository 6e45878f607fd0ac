#pragma once
// CpuBatchEngine: the reference CPU backend as a serving engine that owns its step loop — continuous batching of
// many requests, each step one ragged batch through CpuLlama::forward (the rows of every request concatenated into
// one matrix product per weight, attention per request over its own KV), kvfuse's fusion methods through the
// request-keyed hooks of FusionConnector (fusion/connector.hpp), exactly as a GPU engine would call them.
//
// A step (step()): new requests are planned (FusionConnector::plan, no side effects) and their loads started; a
// full-prefill request whose prompt has stored prefix entries (prefix_chunk_keys) is a Cake request, its stored prefix
// loaded from the back by CakeRequests' I/O thread (schedule/cake_requests.hpp). Cake's TokenBudgetScheduler splits the
// token budget (Cake §3, §5.4) — one row to every decoding request first, then prefills in arrival order: a
// full-prefill request takes the budget in chunks (chunked prefill, each ending on an attention query block where the
// budget allows: chunk_end), a fusion request's partial prefill (|S_0| rows; its S_l shrink on later layers) runs
// whole in one step, when the budget left holds it or nothing else is in the step (a two-pass plan's second pass,
// QueryProbe, the same in a later step); last, what is left goes to the Cake requests'
// compute sides, each computing from the front up to where its loads are (Cake §4, appendix B; with
// BatchEngineConfig::cake_speeds at most one compute chunk sized for its stored prefix by choose_chunk_sizes). Where a
// Cake request's two sides met, its loaded KV is installed at the next step and the rest of its prompt is chunked
// prefill. Reused chunks without a stored chunk cache (not Cache-Craft's: below) are computed in context for the
// request; their chunk caches (CacheBlend's: alone at position 0; behind the layout's chunk_context when it has one,
// the context's rows computed with the chunk's and not stored), saved asynchronously for later requests, are queued and
// computed last, with the budget a step leaves, so that they do not lengthen the prefill of the request that needs
// them; one a step once it has waited a step, so that a server whose budget is always taken still stores them. The step
// whose prefill computes a prompt's last row samples the first token; each later step one more. With
// BatchEngineConfig::store_prefixes, that step also saves the prompt's KV as Cake's prefix entries for later requests
// with the same prefix, and a full prefill's finish saves its answer's KV rows after them (a conversation's next turn
// starts with the prompt and the answer). Requests arrive (submit) and leave (finish, cancel) between steps; a finished
// request frees its KV.
//
// Cache-Craft requests plan with the engine's VariantCache (Cache-Craft §3.3, BatchEngineConfig::variants): each chunk
// with a stored variant loads the one of lowest CFO (eq. 12) and fixes its eq. 14 tokens; a chunk without one is
// computed on every layer, and the request's own attention statistics over the layout's chunks (eq. 3-11, 14) make it a
// variant for its prefix in this prompt, its KV saved when the prefill ends and chosen by later plans once stored — as
// does a variant chunk whose fix is the whole chunk (⌈CFO · |C|⌉ = |C|) on every layer. The variant metadata lives in
// the engine's process; only the KV is in the store (a variant the store lost is a failed read: computed, and
// forgotten).
//
// Failures stay with their request: a failed or timed-out read of one request's entries takes it out of the step
// (FusionConnector::recover: those chunks are computed instead) and it prefills again in a later step; the other
// requests of the batch are not touched. A Cake request's load that misses, fails or does not fit stops its loads:
// its compute side covers the rest (chunked prefill from where it got to). Bad input is refused at submit with a
// kvfuse::error naming it (code beyond_context for a prompt plus max_tokens beyond the model's context).
//
// The first token's logits of a request equal those of FusionPipeline::run of the same prompt and method over the
// same store contents, bit for bit, batched or alone (CpuLlama::forward's rows do not see each other; a chunked full
// prefill's chunks end on query blocks wherever the budget allows, so their bits do not depend on the split). A Cake
// request's equal full prefill's to float rounding when its stored prefix is full prefill's KV: where its two sides
// meet sets the boundaries of its computed chunks, and the softmax sums a query block's keys in SIMD lanes with a
// scalar tail, so the last bits depend on them.
//
// Thread safety: submit and cancel from any thread; step and idle from one thread (the engine's loop).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "kvfuse/backend/cpu/llama.hpp"
#include "kvfuse/backend/cpu_llama.hpp"
#include "kvfuse/cache/variant_cache.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/sampling.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/fusion/connector.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/variant_book.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/cake_requests.hpp"
#include "kvfuse/schedule/chunk_sizes.hpp"
#include "kvfuse/schedule/token_budget_scheduler.hpp"

namespace kvfuse {

struct GenerationRequest {
  std::vector<token_id> tokens;         // the prompt
  PromptLayout layout;                  // its chunks (reusable anywhere) and query; covers every token
  FusionMethod method = FullRecompute{};
  std::int64_t max_new_tokens = 16;
  std::vector<token_id> stop_tokens;    // generation ends at one of these (not returned)
  double temperature = 0.0;             // 0: greedy; > 0: sampled from softmax(logits / temperature)
  std::uint64_t seed = 0;               // of the sampler (temperature > 0)
};

enum class FinishReason { none, length, stop, cancelled, error };

// What kvfuse did for a request, reported when it finishes.
struct RequestMetrics {
  std::string method;
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t loaded_tokens = 0;      // prompt rows whose KV came from the store
  std::int64_t stored_prefix = 0;      // Cake: the stored exact prefix found at submit (0: not a Cake request)
  std::int64_t meet_token = 0;         // Cake: rows [0, meet_token) computed from the front, the rest loaded
  double recomputed_rows = 0.0;        // Σ_l |S_l| / L: prompt rows recomputed, averaged over the layers
  double ttft_ms = 0.0;                // submit -> first token
  std::int64_t restarts = 0;           // prefills run again after a failed read
};

struct TokenEvent {
  std::uint64_t request = 0;
  std::optional<token_id> token;       // a new token of the request
  FinishReason finish = FinishReason::none;
  Status status = Status::success;     // of a request that ended in error
  std::string error;
  RequestMetrics metrics;              // when finish != none
};

struct StepStats {
  StepPlan plan;                       // the scheduler's split of the step's token budget
  std::int64_t decode_rows = 0;
  std::int64_t prefill_rows = 0;       // |S_0| of the step's prefills (chunk caches and Cake rows included)
  std::int64_t cake_rows = 0;          // rows the Cake requests' compute sides computed (at most their allocation)
  std::int64_t items = 0;              // requests (and chunk caches) in the batch
  double step_ms = 0.0;
  double hook_ms = 0.0;                // inside kvfuse's per-layer hooks (FusionConnector), not blocked: the policies
  double wait_ms = 0.0;                // blocked in wait_for_layer for a layer still being read (visible load time)
  double install_ms = 0.0;             // the engine installing loaded layers into its KV and RoPE-shifting them
};

struct BatchEngineConfig {
  TokenBudgetConfig budget{};          // Cake's token budget per step
  ConnectorConfig connector{};
  std::size_t max_running = 64;        // requests admitted at once (the rest queue)
  LoaderConfig cake{};                 // Cake requests: fetch_chunk (the prefix entries' grid) and mode; compute_chunk
                                       // is set to the token budget (the unit of the adaptive mode's predictions)
  LoaderEstimate cake_estimate{};      // the adaptive mode's a-priori costs
  std::optional<CakeSpeeds> cake_speeds{};  // set: the engine's speeds before it ran, kept up to date from its steps'
                                            // forward passes and its Cake requests' fetches; each Cake request's
                                            // compute side then takes at most choose_chunk_sizes' compute chunk (for
                                            // its stored prefix, under cake_rule) per step, its estimate from them
  ChunkRule cake_rule{};
  bool store_prefixes = false;         // a full prefill leaves its prompt's KV, then its answer's, as Cake's prefix
                                       // entries (prefix_chunk_keys on cake.fetch_chunk's grid: the whole chunks of the
                                       // rows whose KV it computed), so that a later prompt that starts with the same
                                       // tokens (a conversation's system prompt, earlier turns and answers) is a Cake
                                       // request
  VariantCacheConfig variants{};       // Cache-Craft's variants of cachecraft requests (N x M, §3.3)

  void validate() const {
    budget.validate();
    variants.validate();
    connector.validate();
    cake.validate();
    cake_estimate.validate();
    if (cake_speeds) cake_speeds->validate();
    cake_rule.validate();
    detail::require(max_running >= 1, "BatchEngineConfig: max_running = {} must be >= 1", max_running);
  }
};

// Where a chunked prefill that has computed rows [0, prefilled) of a prompt of num_tokens rows and may take `tokens`
// more ends: on a multiple of the attention's query block (CpuLlama::query_block) unless it reaches the prompt's end
// or no multiple lies in its range, so that the rows' KV and logits are the bits of one pass however the token budget
// of each step split the prompt (a batch-independent full prefill: the same bits batched as alone).
[[nodiscard]] inline std::int64_t chunk_end(std::int64_t prefilled, std::int64_t tokens, std::int64_t num_tokens,
                                            std::int64_t block) noexcept {
  const std::int64_t end = prefilled + tokens;
  const std::int64_t aligned = end / block * block;
  return end == num_tokens || aligned <= prefilled ? end : aligned;
}

template <RangedKVStore Store>
class CpuBatchEngine {
 public:
  CpuBatchEngine(const CpuLlama& model, Store& store, BatchEngineConfig config = {})
      : model_(&model),
        config_((config.validate(), config)),
        scheduler_(config.budget),
        connector_(store, engine_shape(CpuLlamaFusion(model)), config.connector),
        store_(&store),
        variants_(config.variants),
        cake_(store, BidirectionalLoader<CpuLlamaFusion, Store>(cake_loader(config), config.cake_estimate)) {
    if (config_.cake_speeds) speeds_.emplace(*config_.cake_speeds);
  }

  [[nodiscard]] FusionConnector<Store>& connector() noexcept { return connector_; }
  [[nodiscard]] const CpuLlama& model() const noexcept { return *model_; }
  // Cache-Craft's variants whose KV is stored (read between steps; a step admits those saved since the last).
  [[nodiscard]] const VariantCache& variants() const noexcept { return variants_.cache(); }

  // Blocks until every save issued so far is done, and admits the variants they stored (what the next step would
  // do first). From the engine's loop thread, between steps.
  void wait_for_saves() {
    connector_.wait_for_saves();
    collect_saves();
  }

  // Queues a request; returns its id. Throws kvfuse::error naming a bad field.
  std::uint64_t submit(GenerationRequest request) {
    check_prompt(request.tokens, request.layout, "CpuBatchEngine::submit");
    detail::require(request.max_new_tokens >= 1, "CpuBatchEngine::submit: max_new_tokens = {} must be >= 1",
                    request.max_new_tokens);
    detail::require(std::isfinite(request.temperature) && request.temperature >= 0.0,
                    "CpuBatchEngine::submit: temperature = {} must be finite and >= 0", request.temperature);
    const std::int64_t context = model_->config().context_length;
    const auto need = static_cast<std::int64_t>(request.tokens.size()) + request.max_new_tokens;
    detail::require_code(context == 0 || need <= context, Status::beyond_context,
                         "CpuBatchEngine::submit: {} prompt tokens + max_new_tokens {} = {} exceed the model's "
                         "context of {} tokens",
                         request.tokens.size(), request.max_new_tokens, need, context);
    for (std::size_t i = 0; i < request.tokens.size(); ++i)
      detail::require(request.tokens[i] >= 0 && request.tokens[i] < model_->config().n_vocab,
                      "CpuBatchEngine::submit: token {} at index {} is outside the vocabulary [0, {})",
                      request.tokens[i], i, model_->config().n_vocab);
    std::lock_guard lock(inbox_mutex_);
    const std::uint64_t id = next_id_++;
    inbox_.emplace_back(id, std::move(request), Clock::now());
    return id;
  }

  // Cancels a request (a client went away): it leaves at the next step with FinishReason::cancelled, its KV freed.
  void cancel(std::uint64_t request) {
    std::lock_guard lock(inbox_mutex_);
    cancelled_.insert(request);
  }

  // Whether nothing is queued or running (requests, or chunk caches for the store).
  [[nodiscard]] bool idle() const {
    std::lock_guard lock(inbox_mutex_);
    return inbox_.empty() && running_.empty() && waiting_.empty() && chunk_queue_.empty();
  }

  [[nodiscard]] const StepStats& last_step() const noexcept { return stats_; }

  // One engine step (see the header comment); the tokens and finishes it produced.
  std::vector<TokenEvent> step() {
    const auto t0 = Clock::now();
    stats_ = {};
    std::vector<TokenEvent> events;
    collect_saves();
    admit(events);
    install_met();

    // Cake's token budget: decodes first, then prefills in arrival order, then Cake requests' compute sides.
    std::vector<std::uint64_t> decodes;
    std::vector<PrefillRequest> prefills;
    for (const auto& [id, r] : running_) {
      if (r->phase == Phase::decode) decodes.push_back(id);
    }
    for (std::uint64_t id : arrival_) {
      Running& r = *running_.at(id);
      if (r.phase != Phase::prefill) continue;
      prefills.push_back(r.cake ? PrefillRequest{id, cake_.wanted(id), true}
                                : PrefillRequest{id, r.prefill_cost(), false});
    }
    stats_.plan = scheduler_.plan_step(decodes, prefills);
    for (BudgetAllocation& a : stats_.plan.allocations) {  // chunked prefills end on query blocks (chunk_end)
      const Running& r = *running_.at(a.id);
      if (a.use != BudgetUse::prefill || !r.is_full()) continue;
      const std::int64_t end = chunk_end(r.prefilled, a.tokens, r.num_tokens(), model_->query_block());
      stats_.plan.used_tokens -= r.prefilled + a.tokens - end;
      a.tokens = end - r.prefilled;
    }
    const StepPlan& plan = stats_.plan;

    items_.clear();
    roles_.clear();
    std::vector<std::vector<token_id>> chunk_tokens;  // chunk caches computed in this step
    std::vector<std::unique_ptr<LlamaKVCache>> chunk_kv;
    std::vector<KVKey> chunk_keys;
    std::vector<std::int64_t> chunk_contexts;  // of each: its leading context rows, computed but not stored
    bool prefill_in_step = false;
    for (const BudgetAllocation& a : plan.allocations) {
      Running& r = *running_.at(a.id);
      if (a.use == BudgetUse::decode) {
        BatchItem item;
        item.kv = &r.fusion.kv();
        item.rows = model_->append_rows(r.fusion.kv(), std::span<const token_id>(&r.last, 1));
        item.tokens = std::span<const token_id>(&r.last, 1);
        items_.push_back(std::move(item));
        roles_.push_back({a.id, Role::decode});
        ++stats_.decode_rows;
        continue;
      }
      if (a.use == BudgetUse::cached_prefill) {  // Cake's compute side, from the front up to the loads
        const TokenRange rows = cake_.claim(a.id, a.tokens);
        if (rows.empty()) continue;
        BatchItem item;
        item.kv = &r.fusion.kv();
        append_range(item.rows, rows);
        item.tokens = slice(r.request.tokens, rows);
        item.want_logits = false;  // the last prompt token is never in a stored prefix
        items_.push_back(std::move(item));
        roles_.push_back({a.id, Role::cake});
        stats_.prefill_rows += rows.size();
        stats_.cake_rows += rows.size();
        continue;
      }
      if (r.is_full()) {  // chunked prefill of rows [prefilled, prefilled + tokens)
        const TokenRange rows{r.prefilled, r.prefilled + a.tokens};
        BatchItem item;
        item.kv = &r.fusion.kv();
        append_range(item.rows, rows);
        item.tokens = slice(r.request.tokens, rows);
        item.want_logits = rows.end == r.num_tokens();
        items_.push_back(std::move(item));
        roles_.push_back({a.id, Role::chunked});
        stats_.prefill_rows += rows.size();
        prefill_in_step = true;
        continue;
      }
      if (a.tokens < r.prefill_cost() && prefill_in_step) continue;  // runs whole, in a later step
      prefill_in_step = true;
      // Reused chunks the store lacks: their caches, alone (or behind the layout's chunk context); queued once, by the
      // first pass.
      const std::int64_t context_rows = r.request.layout.chunk_context;
      const auto context = slice(r.request.tokens, {0, context_rows});
      for (std::size_t j = 0; j < r.plan.chunks.size() && !r.second && !r.is_craft(); ++j) {
        const ChunkPlan& c = r.plan.chunks[j];
        if (c.source != KVSource::compute || !r.request.layout.chunks[j].cached || c.range.empty()) continue;
        const auto tokens = slice(r.request.tokens, c.range);
        KVKey key = chunk_cache_key(model_->fingerprint(), tokens, context);
        if (saving_.count(key.content) != 0 ||
            std::any_of(chunk_queue_.begin(), chunk_queue_.end(), [&](const QueuedChunk& q) { return q.key == key; }))
          continue;
        chunk_queue_.push_back({std::move(key), chunk_cache_input(r.request.tokens, r.request.layout, c.range),
                                context_rows, false});
      }
      // S_0 of the plan, or a two-pass plan's second pass: its rows on every layer over the KV of the first, no hooks.
      BatchItem item;
      item.kv = &r.fusion.kv();
      item.rows = r.second ? *r.second : r.plan.initial;
      r.initial_tokens.resize(item.rows.size());
      for (std::size_t i = 0; i < item.rows.size(); ++i)
        r.initial_tokens[i] = r.request.tokens[static_cast<std::size_t>(item.rows[i])];
      item.tokens = r.initial_tokens;
      const StatisticsNeeds& needs = r.plan.statistics;
      if (!r.second)
        item.needs = {r.plan.per_layer, needs.k_deviation, needs.v_deviation,
                      needs.chunk_mass || needs.self_mass ? &r.plan.layout : nullptr,
                      needs.query_mass ? r.plan.layout.query : TokenRange{}};
      if (r.profiling && !r.second) {  // the statistics that make its computed chunks Cache-Craft variants
        item.needs.after_layer = true;
        item.needs.groups = &r.plan.layout;
      }
      stats_.prefill_rows += static_cast<std::int64_t>(item.rows.size());
      items_.push_back(std::move(item));
      roles_.push_back({a.id, r.second ? Role::second_pass : Role::fusion});
    }
    // The queued chunk caches, in the budget the step leaves; beyond it, one that has waited a step (or one when the
    // step has nothing else).
    for (std::int64_t left = config_.budget.token_budget - stats_.decode_rows - stats_.prefill_rows;
         !chunk_queue_.empty();) {
      const auto size = static_cast<std::int64_t>(chunk_queue_.front().tokens.size());
      if (size > left && !(chunk_kv.empty() && (items_.empty() || chunk_queue_.front().waited))) break;
      left -= size;
      chunk_keys.push_back(std::move(chunk_queue_.front().key));
      chunk_tokens.push_back(std::move(chunk_queue_.front().tokens));
      chunk_contexts.push_back(chunk_queue_.front().context);
      chunk_queue_.pop_front();
      chunk_kv.push_back(std::make_unique<LlamaKVCache>(model_->config().n_layer, model_->config().kv_dim(), size));
    }
    for (QueuedChunk& q : chunk_queue_) q.waited = true;
    for (std::size_t c = 0; c < chunk_kv.size(); ++c) {
      BatchItem item;
      item.kv = chunk_kv[c].get();
      append_range(item.rows, {0, chunk_kv[c]->num_rows()});
      item.tokens = chunk_tokens[c];
      item.want_logits = false;
      items_.push_back(std::move(item));
      roles_.push_back({0, Role::chunk_cache});
      stats_.prefill_rows += chunk_kv[c]->num_rows();
    }
    stats_.items = static_cast<std::int64_t>(items_.size());

    if (!items_.empty()) {
      hook_errors_.assign(items_.size(), std::string());
      Hooks hooks{*this};
      const auto f0 = Clock::now();
      model_->forward(items_, hooks);
      if (speeds_)
        speeds_->compute().observe(stats_.prefill_rows + stats_.decode_rows,
                                   std::chrono::duration<double>(Clock::now() - f0).count());
    }
    for (std::size_t c = 0; c < chunk_kv.size(); ++c) {  // asynchronous puts of the new chunk caches
      saving_.insert(chunk_keys[c].content);
      KVBlock block = chunk_kv[c]->to_block({chunk_contexts[c], chunk_kv[c]->num_rows()});
      connector_.save(chunk_keys[c], std::move(block));
    }
    collect_saves();

    for (std::size_t i = 0; i < items_.size(); ++i) {
      const Role& role = roles_[i];
      if (role.kind == Role::chunk_cache) continue;
      Running& r = *running_.at(role.id);
      BatchItem& item = items_[i];
      if (role.kind == Role::cake) {
        cake_.computed(role.id, {item.rows.front(), item.rows.back() + 1});
        for (std::int64_t n : item.selected_per_layer) r.selected_rows += n;
        continue;
      }
      if (role.kind == Role::fusion && item.status != Status::success) {  // a failed read: its chunks computed
        const ReadFailure failed = connector_.failure(role.id);
        if (failed.chunks.empty()) {  // not a read (a policy or an install refused): it would fail again
          fail(r, item.status, hook_errors_[i], events);
          continue;
        }
        for (std::size_t j : failed.chunks) variants_.forget(r.plan.chunks[j]);  // its KV is gone or unusable
        r.plan = connector_.recover(role.id, r.request.method);
        r.start_profiling();
        r.fusion.begin(r.request.tokens);
        ++r.metrics.restarts;
        if (const Status s = connector_.start(r.plan, r.request.method); s != Status::success) {
          fail(r, s, last_status_message(), events);
        }
        continue;
      }
      if (role.kind == Role::chunked) {
        r.prefilled += static_cast<std::int64_t>(item.rows.size());
        for (std::int64_t n : item.selected_per_layer) r.selected_rows += n;
        if (!item.want_logits) continue;
        if (config_.store_prefixes) save_prefix(r);
      }
      if (role.kind == Role::fusion) {
        for (std::int64_t n : item.selected_per_layer) r.selected_rows += n;
        if (r.profiling) save_variants(r);
        TokenSet rows;  // a two-pass plan's second pass, run in a later step; none: the probe's logits are the result
        const Status s = r.plan.two_pass ? connector_.second_pass(role.id, rows) : Status::success;
        connector_.finish(role.id);
        if (s != Status::success) {
          fail(r, s, last_status_message(), events);
          continue;
        }
        if (!rows.empty()) {
          r.second = std::move(rows);
          continue;
        }
      }
      if (role.kind == Role::second_pass) {
        for (std::int64_t n : item.selected_per_layer) r.selected_rows += n;
        r.second.reset();
      }
      if (r.phase == Phase::prefill) {
        r.phase = Phase::decode;
        r.metrics.ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - r.submitted).count();
        r.metrics.recomputed_rows = static_cast<double>(r.selected_rows) / static_cast<double>(model_->config().n_layer);
      }
      emit(r, sample(r, item.logits), events);
    }
    std::erase_if(arrival_, [this](std::uint64_t id) { return running_.at(id)->phase == Phase::done; });
    std::erase_if(running_, [](const auto& kv) { return kv.second->phase == Phase::done; });
    if (items_.empty() && std::any_of(running_.begin(), running_.end(), [](const auto& kv) { return kv.second->cake; }))
      cake_.wait_for_loads(std::chrono::milliseconds(1));  // only Cake requests, waiting for their loads
    stats_.step_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    return events;
  }

 private:
  using Clock = std::chrono::steady_clock;
  enum class Phase { prefill, decode, done };

  struct Running {
    Running(const CpuLlama& model, std::uint64_t request_id, GenerationRequest r, Clock::time_point t)
        : id(request_id), request(std::move(r)), fusion(model), rng(request.seed), submitted(t) {}
    std::uint64_t id;
    GenerationRequest request;
    CpuLlamaFusion fusion;             // the request's KV
    FusionPlan plan;
    Phase phase = Phase::prefill;
    std::int64_t prefilled = 0;        // full prefill: rows computed (or, for a Cake request, installed) so far
    bool cake = false;                 // a Cake request whose two sides have not met yet
    std::vector<token_id> initial_tokens;
    std::optional<TokenSet> second;    // a two-pass plan after its probe pass: the rows of the second pass
    bool profiling = false;            // a Cache-Craft plan computing reusable chunks in full (start_profiling)
    std::vector<LayerAttention> attention;  // when profiling: each layer's statistics over the layout's chunks,
    std::vector<TokenSet> attended;         // of these rows (S_l)
    std::mt19937_64 rng;
    token_id last = 0;
    std::vector<token_id> generated;   // a full prefill with store_prefixes: its answer so far (rows after the prompt)
    std::int64_t saved_chunks = 0;     // with store_prefixes: the grid chunks saved (or found stored) so far
    std::int64_t selected_rows = 0;
    Clock::time_point submitted;
    RequestMetrics metrics;

    [[nodiscard]] std::int64_t num_tokens() const noexcept { return static_cast<std::int64_t>(request.tokens.size()); }
    [[nodiscard]] bool is_full() const noexcept { return std::holds_alternative<FullRecompute>(request.method); }
    [[nodiscard]] bool is_craft() const noexcept { return std::holds_alternative<CacheCraft>(request.method); }
    // A Cache-Craft plan that computes every row of a reusable chunk collects the attention statistics that make
    // it a variant (VariantBook::collects_variants).
    void start_profiling() {
      attention.clear();
      attended.clear();
      profiling = VariantBook::collects_variants(request.method, request.layout, plan);
    }
    [[nodiscard]] std::int64_t prefill_cost() const noexcept {
      if (is_full()) return num_tokens() - prefilled;
      return static_cast<std::int64_t>(second ? second->size() : plan.initial.size());
    }
  };

  struct Role {
    std::uint64_t id = 0;
    enum Kind { decode, chunked, fusion, second_pass, chunk_cache, cake } kind = decode;
  };

  // The engine's side of the per-layer hooks: fusion items wait for their loaded layer and install it, and hand
  // their statistics to the connector's policy; every other item passes.
  struct Hooks final : StepHooks {
    CpuBatchEngine& e;
    explicit Hooks(CpuBatchEngine& engine) : e(engine) {}
    Status before_layer(std::size_t item, std::int64_t layer) override {
      const Role& role = e.roles_[item];
      if (role.kind != Role::fusion) return Status::success;
      const auto t0 = Clock::now();
      const LayerLoad load = e.connector_.wait_for_layer(role.id, layer);
      const auto t1 = Clock::now();
      e.stats_.wait_ms += load.waited_ms;
      e.stats_.hook_ms += std::chrono::duration<double, std::milli>(t1 - t0).count() - load.waited_ms;
      if (load.status != Status::success) return load.status;
      CpuLlamaFusion& fusion = e.running_.at(role.id)->fusion;
      Status status = Status::success;
      try {
        for (const LayerPiece& p : load.pieces) {
          fusion.load_layer_rows(layer, p.rows, p.bytes, p.stored_first_position);
          if (p.rows.begin != p.stored_first_position)
            fusion.shift_layer_rows(layer, p.rows, p.rows.begin - p.stored_first_position);
        }
      } catch (const error& e2) {
        status = refuse(Status::corrupt_entry, "CpuBatchEngine: request %llu, layer %lld: %s",
                        static_cast<unsigned long long>(role.id), static_cast<long long>(layer), e2.what());
      }
      e.stats_.install_ms += std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
      if (status != Status::success) e.hook_errors_[item] = last_status_message();
      return status;
    }
    Status after_layer(std::size_t item, const LayerReport& report, TokenSet& next) override {
      const auto t0 = Clock::now();
      if (Running& r = *e.running_.at(e.roles_[item].id); r.profiling && report.attention != nullptr) {
        r.attention.push_back(*report.attention);
        r.attended.push_back(report.selected);
      }
      const Status s = e.connector_.after_layer(e.roles_[item].id, report, next);
      e.stats_.hook_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      if (s != Status::success) e.hook_errors_[item] = last_status_message();
      return s;
    }
  };

  static LoaderConfig cake_loader(const BatchEngineConfig& config) {
    LoaderConfig c = config.cake;
    c.compute_chunk = config.budget.token_budget;
    return c;
  }

  // New requests planned and started (up to max_running), cancellations applied.
  void admit(std::vector<TokenEvent>& events) {
    std::set<std::uint64_t> cancelled;
    {
      std::lock_guard lock(inbox_mutex_);
      for (auto& entry : inbox_) waiting_.push_back(std::move(entry));
      inbox_.clear();
      cancelled.swap(cancelled_);
    }
    for (std::uint64_t id : cancelled) {
      std::erase_if(waiting_, [&](const Waiting& w) {
        if (std::get<0>(w) != id) return false;
        events.push_back({id, std::nullopt, FinishReason::cancelled, Status::cancelled, "cancelled", {}});
        return true;
      });
      if (const auto it = running_.find(id); it != running_.end() && it->second->phase != Phase::done) {
        leave(*it->second);
        events.push_back({id, std::nullopt, FinishReason::cancelled, Status::cancelled, "cancelled", it->second->metrics});
      }
    }
    std::erase_if(arrival_, [this](std::uint64_t id) { return running_.at(id)->phase == Phase::done; });
    std::erase_if(running_, [](const auto& kv) { return kv.second->phase == Phase::done; });
    while (!waiting_.empty() && running_.size() < config_.max_running) {
      auto [id, request, submitted] = std::move(waiting_.front());
      waiting_.erase(waiting_.begin());
      auto r = std::make_unique<Running>(*model_, id, std::move(request), submitted);
      r->metrics.method = method_name(r->request.method);
      r->metrics.prompt_tokens = r->num_tokens();
      r->fusion.begin(r->request.tokens);
      Running& ref = *r;
      running_.emplace(id, std::move(r));
      arrival_.push_back(id);
      if (ref.is_full()) {  // a Cake request when its prompt has a stored prefix
        try {
          ref.metrics.stored_prefix =
              cake_.admit(id, ref.fusion, ref.request.tokens,
                          speeds_ ? std::optional<CakeSpeeds>(speeds_->speeds()) : std::nullopt, config_.cake_rule);
        } catch (const std::exception&) {  // the lookup failed: computed like any other prompt
          ref.metrics.stored_prefix = 0;
        }
        ref.cake = ref.metrics.stored_prefix > 0;
        continue;
      }
      try {
        ref.plan = connector_.plan(id, ref.request.tokens, ref.request.layout, ref.request.method,
                                   ref.is_craft() ? variants_.index() : VariantIndex{});
      } catch (const error& e) {
        fail(ref, e.code(), e.what(), events);
        continue;
      }
      variants_.record_uses(ref.plan);  // f_r += 1/CFO (Cache-Craft §3.3)
      ref.start_profiling();
      for (const ChunkPlan& c : ref.plan.chunks)
        if (c.source != KVSource::compute) ref.metrics.loaded_tokens += c.range.size();
      if (const Status s = connector_.start(ref.plan, ref.request.method); s != Status::success)
        fail(ref, s, last_status_message(), events);
    }
  }

  // Cake requests whose two sides met: their loaded KV installed; the rest of their prompt is chunked prefill from
  // the stored prefix's end. A block that does not fit (foreign entry, other position) is computed instead: chunked
  // prefill from the compute side's front.
  void install_met() {
    for (std::uint64_t id : arrival_) {
      Running& r = *running_.at(id);
      if (!r.cake) continue;
      std::optional<typename Cake::Met> met = cake_.take_met(id);
      if (!met) continue;
      r.cake = false;
      r.metrics.meet_token = met->trace.meet_token;
      if (speeds_) speeds_->observe_fetches(met->trace);
      bool fits = true;
      for (const auto& [range, block] : met->blocks) {
        fits = fits && block.first_position == range.begin && block.bytes.size() == r.fusion.block_bytes(range.size());
        if (fits) r.fusion.install_kv(range, block);
      }
      r.prefilled = fits ? met->trace.stored_tokens : met->trace.meet_token;
      r.metrics.loaded_tokens = fits ? met->trace.loaded_tokens : 0;
    }
  }

  // A full prefill's KV as Cake's prefix entries (Cake appendix A, step 2): the whole fetch_chunk-grid chunks of the
  // rows whose KV it computed so far — the prompt's when its prefill ends, then, when it finishes, its answer's after
  // them (decoding computes each answer token's KV but the last's) — less those found stored when it was admitted,
  // those saved before and those being saved; asynchronous puts, as the chunk caches'.
  void save_prefix(Running& r) {
    const std::int64_t c = config_.cake.fetch_chunk;
    const std::int64_t whole = r.fusion.kv().num_rows() / c;
    const std::int64_t first = std::max(r.metrics.stored_prefix / c, r.saved_chunks);
    if (whole <= first) return;
    std::vector<token_id> tokens = r.request.tokens;  // the rows' tokens: the prompt's, then the answer's
    tokens.insert(tokens.end(), r.generated.begin(), r.generated.end());
    const std::vector<KVKey> keys = prefix_chunk_keys(r.fusion.model_fingerprint(),
                                                      std::span<const token_id>(tokens).first(whole * c), c);
    for (std::int64_t j = first; j < whole; ++j) {
      const KVKey& key = keys[static_cast<std::size_t>(j)];
      if (!saving_.insert(key.content).second) continue;
      connector_.save(key, r.fusion.save_rows({j * c, (j + 1) * c}));
    }
    r.saved_chunks = whole;
  }

  // A Cache-Craft request's prefill is done: each reusable chunk it computed on every layer (focus termination did
  // not stop it) becomes a variant for its prefix in this prompt, its profile (CCI, the eq. 14 token order) from the
  // request's own attention statistics, its KV (rotated where it stands) saved asynchronously and chosen by later
  // plans once stored (collect_saves).
  void save_variants(Running& r) {
    for (NewVariant& v : VariantBook::new_variants(r.request.tokens, r.request.layout, r.plan, r.attention, r.attended,
                                                   model_->fingerprint())) {
      if (!saving_.insert(v.key.content).second) continue;
      connector_.save(v.key, r.fusion.save_rows(v.rows));
      pending_variants_.emplace(v.key.content, std::move(v));
    }
    r.profiling = false;
    r.attention.clear();
    r.attended.clear();
  }

  // The saves finished since the last call: their keys leave saving_; a variant whose KV is now stored can be chosen
  // (the KV of the variants it evicts is erased).
  void collect_saves() {
    for (const SaveResult& s : connector_.finished_saves()) {
      saving_.erase(s.key.content);
      const auto v = pending_variants_.find(s.key.content);
      if (v == pending_variants_.end()) continue;
      if (s.status == Status::success)
        variants_.admit(v->second.profile, v->second.key, v->second.rows.begin, *store_);
      pending_variants_.erase(v);
    }
  }

  // r leaves: its loads stop, its buffers are freed.
  void leave(Running& r) {
    connector_.finish(r.id);
    if (r.cake) cake_.remove(r.id);
    r.cake = false;
    r.phase = Phase::done;
  }

  void fail(Running& r, Status s, std::string why, std::vector<TokenEvent>& events) {
    leave(r);
    events.push_back({r.id, std::nullopt, FinishReason::error, s, std::move(why), r.metrics});
  }

  // The next token from `logits`: greedy at temperature 0, else sampled from softmax(logits / T).
  token_id sample(Running& r, std::span<const float> logits) {
    return sample_token(logits, r.request.temperature, r.rng);
  }

  // Records token t of request r: a stop token or the length limit finishes it.
  void emit(Running& r, token_id t, std::vector<TokenEvent>& events) {
    const bool stop = std::find(r.request.stop_tokens.begin(), r.request.stop_tokens.end(), t) !=
                      r.request.stop_tokens.end();
    TokenEvent ev{r.id, std::nullopt, FinishReason::none, Status::success, {}, {}};
    if (!stop) {
      ev.token = t;
      r.last = t;
      ++r.metrics.completion_tokens;
      if (config_.store_prefixes && r.is_full()) r.generated.push_back(t);
    }
    if (stop || r.metrics.completion_tokens == r.request.max_new_tokens) {
      ev.finish = stop ? FinishReason::stop : FinishReason::length;
      ev.metrics = r.metrics;
      r.phase = Phase::done;
      if (config_.store_prefixes && r.is_full()) save_prefix(r);  // the answer's KV after the prompt's
    }
    events.push_back(std::move(ev));
  }

  using Waiting = std::tuple<std::uint64_t, GenerationRequest, Clock::time_point>;
  using Cake = CakeRequests<CpuLlamaFusion, Store>;

  const CpuLlama* model_;
  BatchEngineConfig config_;
  TokenBudgetScheduler scheduler_;
  FusionConnector<Store> connector_;
  Store* store_;                    // where evicted variants' KV is erased
  VariantBook variants_;            // Cache-Craft's variants (step thread only, but the cache itself)
  std::map<std::uint64_t, NewVariant> pending_variants_;  // variants whose KV is being saved, by key content
  Cake cake_;                       // the Cake requests' races and their I/O thread
  std::optional<CakeSpeedMeter> speeds_;  // from config_.cake_speeds, updated as the engine runs
  mutable std::mutex inbox_mutex_;  // guards inbox_, cancelled_, next_id_
  std::vector<Waiting> inbox_;
  std::set<std::uint64_t> cancelled_;
  std::uint64_t next_id_ = 1;
  std::vector<Waiting> waiting_;    // admitted when a running slot frees
  std::map<std::uint64_t, std::unique_ptr<Running>> running_;
  std::vector<std::uint64_t> arrival_;  // running requests in arrival order
  struct QueuedChunk {
    KVKey key;
    std::vector<token_id> tokens;  // the chunk's, after its context's
    std::int64_t context = 0;      // PromptLayout::chunk_context: the leading rows of tokens that are not stored
    bool waited = false;           // queued in an earlier step
  };
  std::deque<QueuedChunk> chunk_queue_;  // chunk caches the store lacks, to compute (step: last in the budget)
  std::set<std::uint64_t> saving_;      // chunk caches and prefix entries being saved (key contents)
  std::vector<BatchItem> items_;        // the step's batch
  std::vector<Role> roles_;             // what each item is
  std::vector<std::string> hook_errors_;  // why an item's hook refused (last_status_message on the hook's thread)
  StepStats stats_;
};

}  // namespace kvfuse
