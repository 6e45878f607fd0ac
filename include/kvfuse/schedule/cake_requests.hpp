#pragma once
// CakeRequests — Cake's requests in an engine that owns its step loop (Cake, ICML 2025: §3, §4, §5.4 and
// appendix B): prompts with a stored exact prefix, their stored chunks loaded from the back on one I/O thread
// while their compute side advances from the front with only the tokens the engine's step gives it.
//
// What it does: admit() looks a prompt's prefix up (BidirectionalLoader::stored_prefix: the longest run of
// leading fetch chunks in the store under their prefix keys, Cake appendix A step 2); a prompt with one is a
// Cake request, and its race — detail::CakeRace, the one state machine of Cake's two sides, with the loader's
// mode and adaptive fallback — starts: the I/O thread fetches its chunks from the back. Each engine step:
//   wanted(id)        the tokens its compute side may compute now (0 while its loader would not start a chunk:
//                     adaptive wait, load-only, static split): TokenBudgetScheduler's PrefillRequest with
//                     cached_prefix, which gets only what decodes and plain prefills leave;
//   claim(id, n)      within an allocation of n tokens, the range to compute from its front, up to where its
//                     loads are now (a load that landed since wanted() shortens it, even to nothing);
//   computed(id, r)   the engine computed r (the step's forward pass ended);
//   take_met(id)      once the two sides met: the loaded blocks to install, in order, and the request's
//                     LoaderTrace (meet_token, loaded_tokens, load_failure, every chunk with its times in seconds
//                     since the CakeRequests was made); the request leaves, the tokens after its stored prefix
//                     are the engine's ordinary chunked prefill.
//   remove(id)        a request cancelled or failed: its loads stop.
//
// Choices:
// - One I/O thread, for the CakeRequests' life, serves the requests' fetches in admission order, each request's
//   from the back, as Cake's integration does (appendix B: one asynchronous get worker reading chunk keys from a
//   queue into which each request's keys are pushed in reverse order): the requests share the store's link, and
//   loading two at once would delay the first one's meeting point for nothing.
// - A request's loader predicts its loads as if they ran now, not behind an earlier request's; in
//   LoaderMode::adaptive the idle budget bounds what that costs. LoaderConfig::compute_chunk is only the unit of
//   its predictions here: give it the engine's token budget.
// - A stored prefix covering the whole prompt is cut back to the fetch boundary before the last token, so every
//   prompt ends with a computed chunk whose logits give the first token.
// - Given the engine's measured speeds (CakeSpeeds), admit() sizes the request's compute chunk for its stored
//   prefix with choose_chunk_sizes (schedule/chunk_sizes.hpp) and takes its estimate from them; wanted() then asks
//   at most one such chunk per step. Without them every request uses the loader's compute_chunk and estimate.
//
// Failures: a fetch that misses, throws or returns a block of the wrong size stops that request's loads; its
// compute side covers the rest (LoaderTrace::load_failure). Other requests are not touched.
//
// Thread safety: the members are called from one thread (the engine's step loop); the I/O thread is internal.
// The store must be safe for concurrent use (every kvfuse store is) when the engine reads it meanwhile.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/chunk_sizes.hpp"
#include "kvfuse/schedule/threaded_loader.hpp"

namespace kvfuse {

template <ComputeBackend Compute, KVStore Store>
class CakeRequests {
 public:
  struct Met {
    std::vector<std::pair<TokenRange, KVBlock>> blocks;  // to install, in token order
    LoaderTrace trace;
  };

  CakeRequests(Store& store, BidirectionalLoader<Compute, Store> loader)
      : store_(&store), loader_(std::move(loader)), t0_(Clock::now()), io_([this] { io_loop(); }) {}
  CakeRequests(const CakeRequests&) = delete;
  CakeRequests& operator=(const CakeRequests&) = delete;
  ~CakeRequests() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    io_.join();  // a fetch in flight completes first (KVStore::get blocks)
  }

  // The stored prefix of `tokens` (0: none, not a Cake request); with one, request `id` joins and its loads
  // start. `compute` gives the model's fingerprint of the prefix keys; `speeds`, when given, the request's compute
  // chunk (choose_chunk_sizes under `rule`) and estimate.
  std::int64_t admit(std::uint64_t id, const Compute& compute, std::span<const token_id> tokens,
                     const std::optional<CakeSpeeds>& speeds = std::nullopt, const ChunkRule& rule = {}) {
    LoaderConfig cfg = loader_.config();
    LoaderEstimate estimate = loader_.estimate();
    const auto n = static_cast<std::int64_t>(tokens.size());
    std::int64_t stored = loader_.stored_prefix(compute, *store_, tokens);
    if (stored == n) stored = (n - 1) / cfg.fetch_chunk * cfg.fetch_chunk;  // the last token is computed
    if (stored == 0) return 0;
    if (speeds) {
      cfg.compute_chunk = choose_chunk_sizes(*speeds, stored, rule).compute_chunk;
      estimate = speeds->estimate(cfg.compute_chunk, cfg.fetch_chunk);
    }
    auto s = std::make_shared<State>(detail::CakeRace(cfg, estimate, stored, n),
                                     prefix_chunk_keys(compute.model_fingerprint(), tokens, cfg.fetch_chunk),
                                     cfg.compute_chunk);
    {
      std::lock_guard lock(mutex_);
      states_.emplace(id, std::move(s));
      order_.push_back(id);
    }
    work_.notify_all();
    return stored;
  }

  // The tokens request `id`'s compute side may compute now: up to where its loads are, at most one compute chunk
  // (to where the sides are predicted to meet, if that is sooner), or 0 while it waits.
  [[nodiscard]] std::int64_t wanted(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    State& s = *states_.at(id);
    TokenRange chunk;  // the loader's own chunk, cut where the sides are predicted to meet; else the scheduler sizes it
    if (s.race.decide_compute(since(), s.fetch_start, chunk) != detail::CakeRace::Decision::start) return 0;
    const std::int64_t c = s.race.computed();
    const bool cut = chunk.end < grid_chunk(c, s.race.compute_end(), s.compute_chunk).end;
    return (cut ? chunk.end : std::min(s.race.compute_end(), c + s.compute_chunk)) - c;
  }

  // The range request `id`'s compute side computes in an allocation of `tokens`: from its front, up to where
  // its loads are now (empty when they reached the front meanwhile).
  [[nodiscard]] TokenRange claim(std::uint64_t id, std::int64_t tokens) {
    std::lock_guard lock(mutex_);
    State& s = *states_.at(id);
    const std::int64_t c = s.race.computed();
    const TokenRange r{c, std::max(c, std::min(c + tokens, s.race.compute_end()))};
    if (!r.empty()) {
      s.compute_start = since();
      s.race.compute_started(s.compute_start);
    }
    return r;
  }

  // The engine computed `r`, the range claim(id, ...) returned.
  void computed(std::uint64_t id, TokenRange r) {
    std::lock_guard lock(mutex_);
    State& s = *states_.at(id);
    s.race.compute_done(r, s.compute_start, since());
  }

  // Once request `id`'s two sides met: what to install and its trace; it leaves. Nothing while they race.
  [[nodiscard]] std::optional<Met> take_met(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    State& s = *states_.at(id);
    if (!s.race.covered()) return std::nullopt;
    Met met{detail::cake_take_loaded(s.race, s.loaded), s.race.finish(since())};
    erase(id);
    return met;
  }

  // Request `id` leaves before its sides met (cancelled, failed): its loads stop; a fetch in flight finishes
  // into nothing.
  void remove(std::uint64_t id) {
    std::lock_guard lock(mutex_);
    if (const auto it = states_.find(id); it != states_.end()) {
      it->second->race.stop_loads();
      erase(id);
    }
  }

  // Blocks until a fetch ends or `limit` passes (an engine step with nothing to run but racing requests).
  void wait_for_loads(std::chrono::milliseconds limit) {
    std::unique_lock lock(mutex_);
    landed_.wait_for(lock, limit);
  }

 private:
  using Clock = std::chrono::steady_clock;

  // One request's race; the I/O thread holds it by shared_ptr while it fetches, so it may leave meanwhile.
  struct State {
    State(detail::CakeRace r, std::vector<KVKey> k, std::int64_t chunk)
        : race(std::move(r)), keys(std::move(k)), compute_chunk(chunk) {}
    detail::CakeRace race;
    std::vector<KVKey> keys;                 // the prompt's prefix keys
    std::int64_t compute_chunk;              // its compute side's chunk
    std::map<std::int64_t, KVBlock> loaded;  // fetched blocks by first token
    double fetch_start = detail::kNoFetch;   // of the fetch in flight
    double compute_start = 0;                // of the range claimed last
  };

  [[nodiscard]] double since() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  void erase(std::uint64_t id) {  // under the lock
    states_.erase(id);
    std::erase(order_, id);
  }

  // The I/O thread: the next chunk of the first request, in admission order, that has one to load.
  void io_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      std::shared_ptr<State> s;
      TokenRange r;
      work_.wait(lock, [&] {
        if (stopping_) return true;
        for (std::uint64_t id : order_) {
          if (const std::optional<TokenRange> next = states_.at(id)->race.next_fetch()) {
            s = states_.at(id);
            r = *next;
            return true;
          }
        }
        return false;
      });
      if (stopping_) return;
      detail::cake_io_step(s->race, *store_, s->keys, loader_.config().fetch_chunk, r, s->loaded, s->fetch_start, lock,
                           [this] { return since(); });
      landed_.notify_all();
    }
  }

  Store* store_;
  BidirectionalLoader<Compute, Store> loader_;
  Clock::time_point t0_;
  std::mutex mutex_;
  std::condition_variable work_;    // the I/O thread waits for a request with a chunk to load
  std::condition_variable landed_;  // the engine waits for a fetch to end
  std::map<std::uint64_t, std::shared_ptr<State>> states_;
  std::vector<std::uint64_t> order_;  // admission order
  bool stopping_ = false;
  std::thread io_;  // last: it starts once everything above is ready
};

}  // namespace kvfuse
