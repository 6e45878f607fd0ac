#pragma once
// kvfuse-server --engine llamacpp: llama.cpp's forward pass under the server's step loop. LlamaCppEngine gives
// kvfuse::llamacpp::LlamaCppBatchEngine (several requests per llama_decode, fixed-set methods) the interface the
// server's Service drives CpuBatchEngine through — submit, cancel, idle, step, last_step — with its events as
// TokenEvents and each request's figures (TTFT, rows loaded and recomputed) as RequestMetrics. The batch engine
// saves the chunk caches of the reusable chunks a request computed (BatchOptions::save_chunk_caches), so later
// requests load them from the server's store, as on the CPU engine. LlamaCppBatchEngine is not thread-safe: every
// call here takes one lock, so a request submitted during a step waits for it.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "kvfuse/backend/cpu/batch_engine.hpp"  // GenerationRequest, TokenEvent, StepStats: the server's vocabulary
#include "kvfuse/llamacpp_batch.hpp"

#include "any_store.hpp"

namespace kvfuse_server {

class LlamaCppEngine {
 public:
  LlamaCppEngine(const std::filesystem::path& gguf, kvfuse::AnyKVStore& store, kvfuse::llamacpp::BatchOptions options)
      : engine_(gguf, store, with_saves(options)), cells_(options.region_cells) {}

  // Cells of a request (its prompt and answer): the server's context limit on this engine.
  [[nodiscard]] std::int64_t context_length() const noexcept { return cells_; }
  [[nodiscard]] int threads() const noexcept { return engine_.threads(); }
  [[nodiscard]] std::int64_t num_layers() const noexcept { return engine_.num_layers(); }

  std::uint64_t submit(kvfuse::GenerationRequest g) {
    kvfuse::llamacpp::BatchRequest r;
    r.tokens = std::move(g.tokens);
    r.layout = std::move(g.layout);
    r.method = std::move(g.method);
    r.max_new_tokens = g.max_new_tokens;
    r.stop_tokens = std::move(g.stop_tokens);
    r.temperature = g.temperature;
    r.seed = g.seed;
    Tracked t;
    t.metrics.method = kvfuse::method_name(r.method);
    t.metrics.prompt_tokens = static_cast<std::int64_t>(r.tokens.size());
    t.submitted = Clock::now();
    std::lock_guard lock(mutex_);
    const std::uint64_t id = engine_.submit(std::move(r));
    tracked_.emplace(id, std::move(t));
    return id;
  }

  void cancel(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    engine_.cancel(id);
  }

  [[nodiscard]] bool idle() const {
    std::lock_guard lock(mutex_);
    return engine_.idle();
  }

  std::vector<kvfuse::TokenEvent> step() {
    std::lock_guard lock(mutex_);
    const auto t0 = Clock::now();
    std::vector<kvfuse::llamacpp::BatchEvent> events = engine_.step();
    const auto t1 = Clock::now();
    stats_ = {};
    stats_.step_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    stats_.decode_rows = engine_.last_step_decodes();
    stats_.prefill_rows = engine_.last_step_rows() - stats_.decode_rows;
    stats_.items = engine_.last_step_rows() > 0 ? engine_.running() : 0;
    std::vector<kvfuse::TokenEvent> out;
    out.reserve(events.size());
    for (kvfuse::llamacpp::BatchEvent& e : events) {
      const auto it = tracked_.find(e.request);
      if (it == tracked_.end()) continue;
      kvfuse::RequestMetrics& m = it->second.metrics;
      if (!e.logits.empty()) {  // the first token's event
        m.ttft_ms = std::chrono::duration<double, std::milli>(t1 - it->second.submitted).count();
        m.loaded_tokens = e.loaded_rows;
        m.recomputed_rows = static_cast<double>(e.recomputed_rows);
      }
      if (e.token) ++m.completion_tokens;
      kvfuse::TokenEvent t{e.request, e.token, finish(e.finish), e.status, std::move(e.error), {}};
      if (t.finish != kvfuse::FinishReason::none) {
        t.metrics = std::move(m);
        tracked_.erase(it);
      }
      out.push_back(std::move(t));
    }
    return out;
  }

  [[nodiscard]] const kvfuse::StepStats& last_step() const noexcept { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Tracked {
    Clock::time_point submitted;
    kvfuse::RequestMetrics metrics;
  };

  static kvfuse::llamacpp::BatchOptions with_saves(kvfuse::llamacpp::BatchOptions o) {
    o.save_chunk_caches = true;
    return o;
  }

  static kvfuse::FinishReason finish(kvfuse::llamacpp::BatchFinish f) {
    switch (f) {
      case kvfuse::llamacpp::BatchFinish::length: return kvfuse::FinishReason::length;
      case kvfuse::llamacpp::BatchFinish::stop: return kvfuse::FinishReason::stop;
      case kvfuse::llamacpp::BatchFinish::cancelled: return kvfuse::FinishReason::cancelled;
      case kvfuse::llamacpp::BatchFinish::error: return kvfuse::FinishReason::error;
      case kvfuse::llamacpp::BatchFinish::none: break;
    }
    return kvfuse::FinishReason::none;
  }

  mutable std::mutex mutex_;  // guards everything below: LlamaCppBatchEngine is not thread-safe
  kvfuse::llamacpp::LlamaCppBatchEngine<kvfuse::AnyKVStore> engine_;
  std::int64_t cells_;
  std::map<std::uint64_t, Tracked> tracked_;
  kvfuse::StepStats stats_;
};

}  // namespace kvfuse_server
