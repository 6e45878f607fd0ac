#pragma once
// The server's Prometheus metrics (text exposition format 0.0.4): HTTP responses by route and status, finished
// completions by reason, time to first token and engine step time as histograms, prompt rows loaded from the store
// and recomputed, the store's chunk-cache hits and misses, and the load time still visible in the steps (the
// engine waiting in kvfuse's per-layer hooks for a layer being read), and the Cache-Craft variants the engine keeps.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace kvfuse_server {

class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                  0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  void observe(double seconds) {
    for (std::size_t i = 0; i < kBounds.size(); ++i)
      if (seconds <= kBounds[i]) ++buckets_[i];
    ++count_;
    sum_ += seconds;
  }
  void render(std::string& out, const std::string& name, const std::string& help) const {
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    for (std::size_t i = 0; i < kBounds.size(); ++i)
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], buckets_[i]);
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
  }

 private:
  std::array<std::int64_t, kBounds.size()> buckets_{};
  std::int64_t count_ = 0;
  double sum_ = 0.0;
};

// Cache-Craft's variants the engine keeps (CpuBatchEngine::variants).
struct VariantGauges {
  std::int64_t held = 0;
  std::int64_t capacity = 0;  // N x M
  std::int64_t inserted = 0;
  std::int64_t evicted = 0;
};

// What the metrics read at scrape time from the engine and the store.
struct Gauges {
  std::int64_t in_flight = 0;  // requests in the engine (queued or running)
  std::int64_t queue_limit = 0;
  std::vector<std::pair<std::string, std::int64_t>> store_hits;  // per tier, fastest first
  std::int64_t store_misses = 0;
  std::int64_t redis_unavailable = 0;
  std::int64_t redis_rejected = 0;
  std::int64_t memory_bytes = 0;      // the memory tier's payload
  std::int64_t memory_evictions = 0;  // entries it evicted to make room (--memory-bytes)
  std::optional<VariantGauges> variants;  // none: the engine keeps no variants (llamacpp)
};

class Metrics {
 public:
  void response(const std::string& route, int status) {
    std::lock_guard lock(mutex_);
    ++responses_[{route, status}];
  }
  // A request the engine finished: its reason ("stop", "length", "cancelled", "error") and kvfuse's figures.
  void finished(const std::string& reason, std::int64_t prompt_tokens, std::int64_t completion_tokens,
                std::int64_t loaded, double recomputed, double ttft_ms, bool had_first_token) {
    std::lock_guard lock(mutex_);
    ++finished_[reason];
    prompt_tokens_ += prompt_tokens;
    completion_tokens_ += completion_tokens;
    loaded_tokens_ += loaded;
    recomputed_rows_ += recomputed;
    if (had_first_token) ttft_.observe(ttft_ms / 1000.0);
  }
  void step(double step_ms, double wait_ms, double hook_ms, std::int64_t decode_rows, std::int64_t prefill_rows) {
    std::lock_guard lock(mutex_);
    step_.observe(step_ms / 1000.0);
    wait_s_ += wait_ms / 1000.0;
    hook_s_ += hook_ms / 1000.0;
    decode_rows_ += decode_rows;
    prefill_rows_ += prefill_rows;
  }

  [[nodiscard]] std::string render(const Gauges& g) const {
    std::lock_guard lock(mutex_);
    std::string out;
    const auto counter = [&out](const char* name, const char* help, auto value) {
      out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, value);
    };
    const auto gauge = [&out](const char* name, const char* help, auto value) {
      out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, value);
    };
    out += "# HELP kvfuse_http_requests_total HTTP responses by route and status code.\n"
           "# TYPE kvfuse_http_requests_total counter\n";
    for (const auto& [key, n] : responses_)
      out += fmt::format("kvfuse_http_requests_total{{route=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
    out += "# HELP kvfuse_requests_finished_total Chat completions the engine finished, by reason.\n"
           "# TYPE kvfuse_requests_finished_total counter\n";
    for (const auto& [reason, n] : finished_)
      out += fmt::format("kvfuse_requests_finished_total{{reason=\"{}\"}} {}\n", reason, n);
    ttft_.render(out, "kvfuse_ttft_seconds", "Time to first token in the engine (submit to first token).");
    step_.render(out, "kvfuse_step_seconds", "Time of one engine step (one ragged batch).");
    counter("kvfuse_prompt_tokens_total", "Prompt tokens of finished requests.", prompt_tokens_);
    counter("kvfuse_completion_tokens_total", "Tokens generated for finished requests.", completion_tokens_);
    counter("kvfuse_tokens_loaded_total", "Prompt rows whose KV was loaded from the store.", loaded_tokens_);
    counter("kvfuse_tokens_recomputed_total", "Prompt rows recomputed (summed over layers, divided by the layers).",
            recomputed_rows_);
    counter("kvfuse_load_wait_seconds_total", "Steps' time waiting in the hooks for a layer still being read.", wait_s_);
    counter("kvfuse_hook_seconds_total", "Steps' time inside kvfuse's per-layer hooks (installing, the policies).",
            hook_s_);
    counter("kvfuse_decode_rows_total", "Decode rows the steps computed.", decode_rows_);
    counter("kvfuse_prefill_rows_total", "Prefill rows the steps computed (chunk caches included).", prefill_rows_);
    out += "# HELP kvfuse_store_hits_total Chunk caches the planner found, by the store tier that held them.\n"
           "# TYPE kvfuse_store_hits_total counter\n";
    for (const auto& [tier, n] : g.store_hits) out += fmt::format("kvfuse_store_hits_total{{tier=\"{}\"}} {}\n", tier, n);
    counter("kvfuse_store_misses_total", "Chunk caches the planner found in no tier.", g.store_misses);
    counter("kvfuse_redis_unavailable_total", "Redis reads the server could not answer (misses).", g.redis_unavailable);
    counter("kvfuse_redis_rejected_total", "Redis values rejected by their checks (misses).", g.redis_rejected);
    counter("kvfuse_store_memory_evictions_total", "Chunk caches the memory tier evicted (least recently used).",
            g.memory_evictions);
    gauge("kvfuse_store_memory_bytes", "Bytes of chunk caches in the memory tier (at most --memory-bytes).",
          g.memory_bytes);
    gauge("kvfuse_requests_in_flight", "Requests in the engine, queued or running.", g.in_flight);
    gauge("kvfuse_queue_limit", "Requests the engine takes at once (--queue-limit); more are answered 429.",
          g.queue_limit);
    if (g.variants) {
      gauge("kvfuse_cachecraft_variants", "Cache-Craft chunk-cache variants held (their KV stored).", g.variants->held);
      gauge("kvfuse_cachecraft_variants_capacity", "Variants the engine keeps at most (N chunks x M variants).",
            g.variants->capacity);
      counter("kvfuse_cachecraft_variants_inserted_total", "Variants admitted once their KV was stored.",
              g.variants->inserted);
      counter("kvfuse_cachecraft_variants_evicted_total", "Variants evicted (lowest reuse frequency) and their KV "
              "erased.", g.variants->evicted);
    }
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, std::int64_t> responses_;
  std::map<std::string, std::int64_t> finished_;
  Histogram ttft_, step_;
  std::int64_t prompt_tokens_ = 0, completion_tokens_ = 0, loaded_tokens_ = 0, decode_rows_ = 0, prefill_rows_ = 0;
  double recomputed_rows_ = 0.0, wait_s_ = 0.0, hook_s_ = 0.0;
};

}  // namespace kvfuse_server
