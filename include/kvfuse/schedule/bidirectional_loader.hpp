#pragma once
// BidirectionalLoader — Cake ("Compute Or Load KV Cache? Why Not Both?", ICML 2025: section 4 and
// appendix A, Algorithm 1).
//
// What it does: prepares the KV of a prompt whose prefix KV is stored (prefix cache on disk, remote
// store) by computing chunked prefill from token 0 forward while fetching stored KV from the end of the
// stored prefix backward, concurrently, and stopping where the two meet. Tokens after the stored prefix
// are computed afterwards.
//
// When to use it: long prompts with a prefix-cache hit in a store slower than GPU memory, when neither
// loading everything (I/O-only) nor recomputing everything (compute-only) is clearly best, or when the
// GPU share and bandwidth change under load. For reuse of non-prefix chunks use the fusion selectors
// (HKVDSelector, AttnLinkBoundary, CCIScorer) instead; for a store as fast as HBM just load.
//
// Defaults from the paper: compute chunk 512 tokens (vLLM token budget), fetch chunk 128 tokens. Where one such
// chunk is a large share of the time to first token (a CPU, a small GPU share, a short prefix), pick them from
// measured speeds with choose_chunk_sizes (schedule/chunk_sizes.hpp).
//
// Beyond the paper (its section 5 leaves this as future work): in LoaderMode::adaptive the compute side
// does not start a chunk that is predicted to finish only after the loads have reached it — a GPU chunk
// cannot be abandoned, so such a chunk would only delay the first token. Predictions use observed
// durations (or the a-priori LoaderEstimate before anything is observed). To bound the cost of a wrong
// prediction the compute side idles at most one chunk's estimated time in total, then runs
// unconditionally (ski rental). Loads can always be abandoned, so they always run. Hence, for constant
// rates, the loader is never slower than min(compute-only, load-only) by more than one chunk's time. And a chunk
// it starts is cut where the two sides are predicted to meet (the fetch boundary minimizing when both are done),
// so the last compute chunk does not run on past where the loaded KV will begin.
//
// Missing or failing store entries (evicted between lookup and fetch, a store that goes away) stop the
// loads; the compute side then covers the rest. The failure is recorded in the trace, nothing is lost.
//
// Three drivers run the same race (detail::CakeRace): BidirectionalLoader::run, in virtual time, for backends
// that model their costs (CostModeledCompute / CostModeledStore: simulations, what-if planning), here;
// run_threaded (schedule/threaded_loader.hpp, umbrella kvfuse/runtime.hpp), two real threads on the steady
// clock, for real backends; and CakeRequests (schedule/cake_requests.hpp), Cake requests next to other traffic
// in an engine's step loop, their compute side fed by TokenBudgetScheduler (CpuBatchEngine). This header starts
// no thread.

#include <algorithm>
#include <concepts>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

enum class LoaderMode {
  adaptive,       // Cake + fallback: skip compute chunks that cannot finish before the meeting point
  bidirectional,  // Cake Algorithm 1 as published
  compute_only,   // chunked prefill of everything (baseline)
  load_only,      // load the whole stored prefix, compute only the rest (baseline)
  static_split,   // compute [0, split) while loading [split, stored), both from the start (Cake Table 3's
                  // "optimal static split" baseline, found by trying every split)
};

struct LoaderConfig {
  std::int64_t compute_chunk = 512;  // Cake: token budget of one chunked-prefill step
  std::int64_t fetch_chunk = 128;    // Cake: granularity of stored prefix chunks
  LoaderMode mode = LoaderMode::adaptive;
  std::int64_t split = 0;  // static_split only: a multiple of fetch_chunk (capped at the stored prefix)

  void validate() const {
    detail::require(compute_chunk > 0, "LoaderConfig: compute_chunk = {} must be > 0", compute_chunk);
    detail::require(fetch_chunk > 0, "LoaderConfig: fetch_chunk = {} must be > 0", fetch_chunk);
    const auto m = static_cast<int>(mode);
    detail::require(m >= 0 && m <= static_cast<int>(LoaderMode::static_split),
                    "LoaderConfig: mode = {} is not a LoaderMode", m);
    detail::require(split >= 0 && split % fetch_chunk == 0,
                    "LoaderConfig: split = {} must be a non-negative multiple of fetch_chunk = {}", split, fetch_chunk);
  }
};

// A-priori costs for the adaptive mode, used until the first chunk of each side has been observed.
// Zero means unknown (the loader then behaves as Cake does until it has observed something).
struct LoaderEstimate {
  double compute_a_s = 0;   // compute chunk i takes compute_a_s + compute_b_s·i seconds
  double compute_b_s = 0;
  double fetch_chunk_s = 0;  // one fetch chunk, latency included
  double compute_call_s = 0; // the part of a chunk's time any compute call costs, whatever its size (a cut chunk
                             // costs this plus its token fraction of the rest)

  void validate() const {
    detail::require_finite_nonneg(compute_call_s, "LoaderEstimate: compute_call_s");
    detail::require_finite_nonneg(compute_a_s, "LoaderEstimate: compute_a_s");
    detail::require_finite_nonneg(compute_b_s, "LoaderEstimate: compute_b_s");
    detail::require_finite_nonneg(fetch_chunk_s, "LoaderEstimate: fetch_chunk_s");
  }
};

struct LoaderStep {
  TokenRange tokens;
  KVSource source = KVSource::compute;  // compute (from the front) or prefix (a stored entry, from the back)
  double start_s = 0;
  double end_s = 0;   // when the step finished; for abandoned loads, when it was abandoned
  bool used = true;   // false: abandoned or made redundant by the other side
};

struct LoaderTrace {
  std::int64_t num_tokens = 0;
  std::int64_t stored_tokens = 0;   // length of the stored prefix found in the store (Cake: total_tokens)
  std::int64_t meet_token = 0;      // tokens [0, meet) computed, [meet, stored) loaded
  std::int64_t computed_tokens = 0; // meet_token + tokens after the stored prefix
  std::int64_t loaded_tokens = 0;   // stored_tokens - meet_token
  double cover_s = 0;               // when every token's KV was resident
  double ready_s = 0;               // cover_s, or later if a compute chunk was still running (GPU busy)
  int skipped_compute_chunks = 0;   // adaptive decisions not to start a compute chunk
  std::string load_failure;         // non-empty when a load failed and compute covered the rest
  std::vector<LoaderStep> steps;
};

namespace detail {

inline constexpr double kNoFetch = std::numeric_limits<double>::quiet_NaN();

// The shared state machine of Cake's two workers: c = computed prefix end, l = loaded suffix begin.
// Drivers (virtual time, threads) ask it what to start and tell it what finished.
class CakeRace {
 public:
  CakeRace(const LoaderConfig& cfg, const LoaderEstimate& est, std::int64_t stored, std::int64_t n)
      : cfg_(cfg), est_(est), stored_(stored), n_(n), l_(stored) {
    loads_enabled_ = cfg.mode != LoaderMode::compute_only;
    if (cfg.mode == LoaderMode::load_only) compute_limit_ = 0;
    if (cfg.mode == LoaderMode::static_split) compute_limit_ = load_floor_ = std::min(cfg.split, stored);
    trace_.num_tokens = n;
    trace_.stored_tokens = stored;
  }

  // Algorithm 1 line 2 / 9: both workers run while compute_ptr < io_ptr.
  [[nodiscard]] bool covered() const noexcept { return c_ >= l_; }
  [[nodiscard]] std::int64_t computed() const noexcept { return c_; }
  // Where the compute side stops for now: the loads' front, or earlier in load-only / static-split mode.
  [[nodiscard]] std::int64_t compute_end() const noexcept {
    return compute_limit_ >= 0 ? std::min(l_, compute_limit_) : l_;
  }

  // Next fetch chunk: the one ending at io_ptr (Algorithm 1 line 10), or nothing.
  [[nodiscard]] std::optional<TokenRange> next_fetch() const {
    if (!loads_enabled_ || covered() || l_ <= load_floor_) return std::nullopt;
    const std::int64_t j = (l_ - 1) / cfg_.fetch_chunk;
    return TokenRange{j * cfg_.fetch_chunk, l_};
  }

  // start: compute `out` now. wait: adaptive skip, decide again by idle_deadline() or when a fetch ends.
  // blocked: load-only or static split, nothing (more) to compute until the loads are done or one fails.
  // done: every token is resident.
  enum class Decision { start, wait, blocked, done };

  // Next compute chunk at `now`; `fetch_start` is when the fetch in flight started, NaN if none.
  // (A plain double: GCC 12 warns falsely on std::optional<double> here at -O2.)
  [[nodiscard]] Decision decide_compute(double now, double fetch_start, TokenRange& out) {
    if (covered()) return Decision::done;
    if (compute_limit_ >= 0 && c_ >= compute_limit_) return Decision::blocked;
    out = grid_chunk(c_, compute_end(), cfg_.compute_chunk);
    if (cfg_.mode != LoaderMode::adaptive || !loads_enabled_ || idle_budget_spent(now)) return Decision::start;
    const std::optional<double> reach = predict_loads_reach_s(now, fetch_start, out.begin);
    if (!reach || !predict_compute_s(out)) return Decision::start;
    out = cut_at_meeting(now, fetch_start, out);
    const double f = *predict_compute_s(out);
    if (now + f < *reach) return Decision::start;
    if (!idle_since_) {
      idle_since_ = now;
      idle_budget_s_ = std::max(idle_budget_s_, f);
      ++trace_.skipped_compute_chunks;
    }
    return Decision::wait;
  }

  // While waiting: when the compute side must start regardless of predictions (its idle budget is spent).
  [[nodiscard]] double idle_deadline() const noexcept {
    return (idle_since_ ? *idle_since_ : 0.0) + idle_budget_s_ - idle_total_s_;
  }

  void compute_started(double now) {
    if (idle_since_) {
      idle_total_s_ += now - *idle_since_;
      idle_since_.reset();
    }
  }

  void compute_done(TokenRange r, double start, double end) {
    trace_.steps.push_back({r, KVSource::compute, start, end, true});
    const double d = end - start;
    if (d > 0 && r.size() > 0) {  // as a whole chunk: the call's fixed cost once, the rest scaled by its tokens
      const double call = std::min(d, est_.compute_call_s);
      observed_compute_ = Observation{r.begin / cfg_.compute_chunk,
                                      call + (d - call) * static_cast<double>(cfg_.compute_chunk) /
                                                 static_cast<double>(r.size())};
    }
    c_ = std::max(c_, r.end);
    if (covered()) mark_cover(end);
  }

  void fetch_done(TokenRange r, double start, double end) {
    trace_.steps.push_back({r, KVSource::prefix, start, end, true});
    observed_fetch_s_ = end - start;
    l_ = std::min(l_, r.begin);
    if (covered()) mark_cover(end);
  }

  // A load failed or its entry was missing: stop loading; compute covers everything not yet loaded.
  void fetch_failed(TokenRange r, double start, double end, std::string why) {
    trace_.steps.push_back({r, KVSource::prefix, start, end, false});
    loads_enabled_ = false;
    compute_limit_ = -1;
    load_floor_ = 0;
    trace_.load_failure = std::move(why);
  }

  // The compute side failed: stop the loads too.
  void stop_loads() noexcept { loads_enabled_ = false; }

  void fetch_abandoned(TokenRange r, double start, double end) {
    trace_.steps.push_back({r, KVSource::prefix, start, end, false});
  }

  // The loaded ranges whose KV must be installed: every successful fetch at or after the meeting point.
  [[nodiscard]] std::vector<TokenRange> ranges_to_install() const {
    std::vector<TokenRange> out;
    for (const LoaderStep& s : trace_.steps)
      if (s.source == KVSource::prefix && s.used && s.tokens.end > c_) out.push_back(s.tokens);
    return out;
  }

  LoaderTrace finish(double ready_s) {
    if (!covered()) mark_cover(ready_s);
    // Race compute steps end at or before the stored prefix; the suffix steps start at it.
    trace_.meet_token = 0;
    for (const LoaderStep& s : trace_.steps)
      if (s.source == KVSource::compute && s.tokens.end <= stored_)
        trace_.meet_token = std::max(trace_.meet_token, s.tokens.end);
    trace_.loaded_tokens = stored_ - trace_.meet_token;
    trace_.computed_tokens = trace_.meet_token + (n_ - stored_);
    trace_.ready_s = std::max(ready_s, trace_.cover_s);
    // Loads wholly inside the computed prefix were redundant.
    for (LoaderStep& s : trace_.steps)
      if (s.source == KVSource::prefix && s.tokens.end <= trace_.meet_token) s.used = false;
    std::sort(trace_.steps.begin(), trace_.steps.end(),
              [](const LoaderStep& a, const LoaderStep& b) { return a.start_s < b.start_s; });
    return std::move(trace_);
  }

 private:
  struct Observation {
    std::int64_t chunk_index;
    double full_chunk_s;
  };

  void mark_cover(double t) {
    if (!cover_marked_) {
      trace_.cover_s = t;
      cover_marked_ = true;
    }
  }

  // Idle time so far (including the current wait) has reached the budget. While waiting this is
  // now >= idle_deadline(), the very expression the virtual driver rechecks at, so it cannot miss by rounding.
  [[nodiscard]] bool idle_budget_spent(double now) const {
    if (idle_budget_s_ <= 0) return false;
    return idle_since_ ? now >= idle_deadline() : idle_total_s_ >= idle_budget_s_;
  }

  [[nodiscard]] double chunk_cost(std::int64_t i) const {
    return est_.compute_a_s + est_.compute_b_s * static_cast<double>(i);
  }

  // Seconds to compute r: a whole chunk's time — the last observed chunk scaled by the cost model's a + b·i
  // growth, else the a-priori estimate — as the call's fixed cost plus r's token fraction of the rest.
  [[nodiscard]] std::optional<double> predict_compute_s(TokenRange r) const {
    const std::int64_t i = r.begin / cfg_.compute_chunk;
    const double fraction = static_cast<double>(r.size()) / static_cast<double>(cfg_.compute_chunk);
    double whole = chunk_cost(i);
    if (observed_compute_) {
      const double base = chunk_cost(observed_compute_->chunk_index);
      whole = observed_compute_->full_chunk_s * (base > 0 ? chunk_cost(i) / base : 1.0);
    }
    if (whole <= 0) return std::nullopt;
    const double call = std::min(whole, est_.compute_call_s);
    return call + (whole - call) * fraction;
  }

  // The chunk `r` cut where the two sides are predicted to meet: its end e, among the fetch boundaries inside r
  // and r.end, minimizes max(now + compute time of [r.begin, e), when the loads reach e) — the time both are
  // done — the larger e on a tie. Computing past e would only redo what the loads bring by then.
  [[nodiscard]] TokenRange cut_at_meeting(double now, double fetch_start, TokenRange r) const {
    const auto done_at = [&](std::int64_t e) {
      const double computed = now + *predict_compute_s({r.begin, e});
      return e >= l_ ? computed : std::max(computed, *predict_loads_reach_s(now, fetch_start, e));
    };
    TokenRange best = r;
    double best_s = done_at(r.end);
    for (std::int64_t e = (r.end - 1) / cfg_.fetch_chunk * cfg_.fetch_chunk; e > r.begin; e -= cfg_.fetch_chunk) {
      if (const double t = done_at(e); t < best_s) std::tie(best, best_s) = std::pair{TokenRange{r.begin, e}, t};
    }
    return best;
  }

  // When the loads will have covered down to `pos`; pessimistic once a fetch overruns its prediction.
  [[nodiscard]] std::optional<double> predict_loads_reach_s(double now, double fetch_start, std::int64_t pos) const {
    double d = observed_fetch_s_ > 0 ? observed_fetch_s_ : est_.fetch_chunk_s;
    if (d <= 0) return std::nullopt;
    std::int64_t boundary = l_;
    double t = now;
    if (!std::isnan(fetch_start)) {
      const double elapsed = now - fetch_start;
      if (elapsed > d) d = elapsed;  // overrunning: assume it takes as long again
      t = fetch_start + d;
      if (t <= now) t = now + d;
      boundary = ((l_ - 1) / cfg_.fetch_chunk) * cfg_.fetch_chunk;
    }
    const std::int64_t remaining = boundary > pos ? (boundary - pos + cfg_.fetch_chunk - 1) / cfg_.fetch_chunk : 0;
    return t + static_cast<double>(remaining) * d;
  }

  LoaderConfig cfg_;
  LoaderEstimate est_;
  std::int64_t stored_;
  std::int64_t n_;
  std::int64_t c_ = 0;
  std::int64_t l_;
  std::int64_t compute_limit_ = -1;  // load_only: compute stops at 0; static_split: at the split; -1 = no limit
  std::int64_t load_floor_ = 0;      // static_split: loads stop at the split
  bool loads_enabled_ = true;
  bool cover_marked_ = false;
  std::optional<Observation> observed_compute_;
  double observed_fetch_s_ = 0;
  std::optional<double> idle_since_;
  double idle_total_s_ = 0;
  double idle_budget_s_ = 0;
  LoaderTrace trace_;
};

// The store key of the fetch chunk starting at r.begin.
[[nodiscard]] inline KVKey cake_key_of(const std::vector<KVKey>& keys, TokenRange r, std::int64_t fetch_chunk) {
  return keys[static_cast<std::size_t>(r.begin / fetch_chunk)];
}

// Fetch and validate one stored chunk; an empty optional plus `why` on a miss or a wrong-sized block.
template <KVStore Store>
std::optional<KVBlock> cake_fetch(Store& store, const KVKey& key, TokenRange r, std::string& why) {
  std::optional<KVBlock> block = store.get(key);
  if (!block) {
    why = fmt::format("stored KV for tokens {} is missing (evicted after lookup?)", r);
  } else if (block->num_tokens != r.size()) {
    why = fmt::format("stored KV for tokens {} holds {} tokens, expected {}", r, block->num_tokens, r.size());
    block.reset();
  }
  return block;
}

// The loaded blocks the compute side did not cover, moved out of `loaded` in order, to install (a threaded
// driver takes them under its lock and installs them after releasing it).
[[nodiscard]] inline std::vector<std::pair<TokenRange, KVBlock>> cake_take_loaded(
    const CakeRace& race, std::map<std::int64_t, KVBlock>& loaded) {
  std::vector<std::pair<TokenRange, KVBlock>> out;
  for (TokenRange r : race.ranges_to_install()) out.emplace_back(r, std::move(loaded.at(r.begin)));
  return out;
}

// The tokens after the stored prefix: plain chunked prefill on the compute chunk grid, chunk after chunk
// from `start`. `run(r, start)` computes r and returns when it ended; `done(r, start, end)` records it (the
// race's compute_done, under the driver's lock if it has one). Returns when the last chunk ended.
template <class RunChunk, class Done>
double cake_compute_after_prefix(std::int64_t stored, std::int64_t n, std::int64_t compute_chunk, double start,
                                 RunChunk run, Done done) {
  for (std::int64_t b = stored; b < n;) {
    const TokenRange r = grid_chunk(b, n, compute_chunk);
    const double end = run(r, start);
    done(r, start, end);
    start = end;
    b = r.end;
  }
  return start;
}

}  // namespace detail

template <ComputeBackend Compute, KVStore Store>
class BidirectionalLoader {
 public:
  explicit BidirectionalLoader(LoaderConfig cfg = {}, LoaderEstimate est = {}) : cfg_(cfg), est_(est) {
    cfg_.validate();
    est_.validate();
  }

  // Length of the stored prefix of `tokens`: the longest run of leading fetch chunks present in the store
  // under their prefix keys (Cake appendix A, step 2).
  [[nodiscard]] std::int64_t stored_prefix(const Compute& compute, const Store& store,
                                           std::span<const token_id> tokens) const {
    const auto keys = prefix_chunk_keys(compute.model_fingerprint(), tokens, cfg_.fetch_chunk);
    std::int64_t stored = 0;
    for (const KVKey& key : keys) {
      if (!store.contains(key)) break;
      stored = std::min<std::int64_t>(stored + cfg_.fetch_chunk, static_cast<std::int64_t>(tokens.size()));
    }
    return stored;
  }

  // Makes the KV of every token of `tokens` resident in `compute`, in virtual time: a deterministic
  // discrete-event schedule of the backends' modelled costs (times from 0). Real backends run the same race
  // on two threads with run_threaded (schedule/threaded_loader.hpp).
  LoaderTrace run(Compute& compute, Store& store, std::span<const token_id> tokens) const
    requires(CostModeledCompute<Compute> && CostModeledStore<Store>)
  {
    const auto n = static_cast<std::int64_t>(tokens.size());
    const std::int64_t stored = stored_prefix(compute, store, tokens);
    const auto keys = prefix_chunk_keys(compute.model_fingerprint(), tokens, cfg_.fetch_chunk);
    detail::CakeRace race(cfg_, est_, stored, n);
    return run_virtual(race, compute, store, keys, n, stored);
  }

  [[nodiscard]] const LoaderEstimate& estimate() const noexcept { return est_; }
  [[nodiscard]] const LoaderConfig& config() const noexcept { return cfg_; }

 private:
  struct InFlight {
    TokenRange range{};
    double start = 0;
    double end = 0;
    bool active = false;
  };

  LoaderTrace run_virtual(detail::CakeRace& race, Compute& compute, Store& store, const std::vector<KVKey>& keys,
                          std::int64_t n, std::int64_t stored) const
    requires(CostModeledCompute<Compute> && CostModeledStore<Store>)
  {
    constexpr double never = std::numeric_limits<double>::infinity();
    double now = 0;
    InFlight comp, io;  // `active` says whether each side has a step in flight
    std::map<std::int64_t, KVBlock> loaded;
    while (!race.covered()) {
      if (!io.active) {
        if (auto r = race.next_fetch()) {
          std::string why;
          if (auto block = detail::cake_fetch(store, detail::cake_key_of(keys, *r, cfg_.fetch_chunk), *r, why)) {
            loaded[r->begin] = std::move(*block);
            io = {*r, now, store.load_finish_s(detail::cake_key_of(keys, *r, cfg_.fetch_chunk), r->size(), now), true};
          } else {
            race.fetch_failed(*r, now, now, why);
          }
        }
      }
      double recheck = never;
      if (!comp.active) {
        TokenRange r;
        switch (race.decide_compute(now, io.active ? io.start : detail::kNoFetch, r)) {
          case detail::CakeRace::Decision::start:
            race.compute_started(now);
            comp = {r, now, compute.compute_finish_s(r, now), true};
            break;
          case detail::CakeRace::Decision::wait:
            // Re-decide when the fetch ends or, at the latest, when the idle budget runs out.
            recheck = std::max(race.idle_deadline(), now);
            break;
          case detail::CakeRace::Decision::blocked:
          case detail::CakeRace::Decision::done:
            break;
        }
      }
      const double next = std::min({comp.active ? comp.end : never, io.active ? io.end : never, recheck});
      detail::require(next < never, "BidirectionalLoader: no progress possible at t = {} s", now);
      now = next;
      if (comp.active && comp.end <= now) {
        compute.compute_kv(comp.range);
        race.compute_done(comp.range, comp.start, comp.end);
        comp.active = false;
      }
      if (io.active && io.end <= now) {
        race.fetch_done(io.range, io.start, io.end);
        io.active = false;
      }
    }
    // Loads still in flight are abandoned; a compute chunk in flight keeps the GPU until it ends.
    if (io.active) race.fetch_abandoned(io.range, io.start, now);
    double gpu_free = now;
    if (comp.active) {
      compute.compute_kv(comp.range);
      race.compute_done(comp.range, comp.start, comp.end);
      gpu_free = comp.end;
    }
    for (const auto& [r, block] : detail::cake_take_loaded(race, loaded)) compute.install_kv(r, block);
    gpu_free = detail::cake_compute_after_prefix(
        stored, n, cfg_.compute_chunk, gpu_free,
        [&](TokenRange r, double start) {
          const double end = compute.compute_finish_s(r, start);
          compute.compute_kv(r);
          return end;
        },
        [&](TokenRange r, double start, double end) { race.compute_done(r, start, end); });
    return race.finish(gpu_free);
  }

  LoaderConfig cfg_;
  LoaderEstimate est_;
};

// The best static split for cost-modelled backends, by exhaustive search over the fetch grid: for every split
// s, the loader in LoaderMode::static_split (compute [0, s) in compute chunks while loading [s, stored) in
// fetch chunks, both from t = 0, then the tokens after the stored prefix), in virtual time on a copy of the
// compute backend (the store is only read). The "oracle" baseline of Cake's Table 3; `stored` caps the splits tried.
struct StaticSplit {
  std::int64_t split = 0;
  double ready_s = 0;
};

template <CostModeledCompute Compute, CostModeledStore Store>
  requires std::copy_constructible<Compute>
[[nodiscard]] StaticSplit best_static_split(const Compute& compute, Store& store,
                                            std::span<const token_id> tokens, std::int64_t stored,
                                            const LoaderConfig& cfg) {
  cfg.validate();
  const auto num_tokens = static_cast<std::int64_t>(tokens.size());
  detail::require(0 <= stored && stored <= num_tokens, "best_static_split: stored prefix {} not in [0, {}]", stored,
                  num_tokens);
  StaticSplit best{0, std::numeric_limits<double>::infinity()};
  for (std::int64_t s = 0;; s = std::min(stored, s + cfg.fetch_chunk)) {
    LoaderConfig split = cfg;
    split.mode = LoaderMode::static_split;
    split.split = (s + cfg.fetch_chunk - 1) / cfg.fetch_chunk * cfg.fetch_chunk;  // s, or stored rounded up (capped)
    Compute c = compute;  // the store is only read
    const double ready = BidirectionalLoader<Compute, Store>(split).run(c, store, tokens).ready_s;
    if (ready < best.ready_s) best = {s, ready};
    if (s == stored) break;
  }
  return best;
}

}  // namespace kvfuse
