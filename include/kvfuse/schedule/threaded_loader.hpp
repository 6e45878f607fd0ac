#pragma once
// run_threaded: Cake's bidirectional loading (BidirectionalLoader, schedule/bidirectional_loader.hpp) on real
// backends — the compute side on the calling thread, the loads on one I/O thread, on the steady clock (times
// in the trace are seconds since the call). The same race as BidirectionalLoader::run's virtual-time driver
// (detail::CakeRace): compute chunks from the front, fetch chunks from the back, stop where they meet, then
// the tokens after the stored prefix.
//
// A fetch still in flight at the meeting point cannot be cancelled (KVStore::get blocks): it completes on the
// I/O thread, overlapping the install and the tokens after the stored prefix, and is recorded as abandoned;
// run_threaded joins the I/O thread before it returns, but ready_s is when the KV was complete. A load that throws, misses or returns a
// wrong-sized block stops the loads and compute covers the rest (LoaderTrace::load_failure); an exception of
// the compute backend stops the loads and is rethrown after the I/O thread has been joined.
//
// Thread safety: `compute` is used by the calling thread only; `store` by the I/O thread only (get) while
// run_threaded runs. Neither may be used by others meanwhile unless they are safe for that.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"

namespace kvfuse {

namespace detail {

// One fetch of Cake's I/O side on a real thread (run_threaded; CakeRequests, schedule/cake_requests.hpp). Called with
// `lock` held and `r` = race.next_fetch(): reads the store with the lock released, then records under it
// whether the chunk landed (its block kept in `loaded`), failed (a miss, a wrong-sized block or an exception:
// the loads stop and compute covers the rest) or came too late (the compute side covered it meanwhile:
// abandoned). `fetch_start` is when the fetch in flight started, NaN between fetches (the argument of
// CakeRace::decide_compute); `since()` is the driver's clock. Returns whether the chunk landed.
template <KVStore Store, class Since>
bool cake_io_step(CakeRace& race, Store& store, const std::vector<KVKey>& keys, std::int64_t fetch_chunk, TokenRange r,
                  std::map<std::int64_t, KVBlock>& loaded, double& fetch_start, std::unique_lock<std::mutex>& lock,
                  Since since) {
  const double start = since();
  fetch_start = start;
  const KVKey key = cake_key_of(keys, r, fetch_chunk);
  lock.unlock();
  std::string why;
  std::optional<KVBlock> block;
  try {
    block = cake_fetch(store, key, r, why);
  } catch (const std::exception& e) {
    why = fmt::format("loading tokens {} failed: {}", r, e.what());
  } catch (...) {
    why = fmt::format("loading tokens {} failed with a non-standard exception", r);
  }
  lock.lock();
  fetch_start = kNoFetch;
  if (race.covered()) {  // the compute side reached it first: not needed any more
    race.fetch_abandoned(r, start, since());
    return false;
  }
  if (!block) {
    race.fetch_failed(r, start, since(), why);
    return false;
  }
  loaded[r.begin] = std::move(*block);
  race.fetch_done(r, start, since());
  return true;
}

}  // namespace detail

// Makes the KV of every token of `tokens` resident in `compute`, as `loader` decides (its config and
// estimate), on two threads.
template <ComputeBackend Compute, KVStore Store>
LoaderTrace run_threaded(const BidirectionalLoader<Compute, Store>& loader, Compute& compute, Store& store,
                         std::span<const token_id> tokens) {
  const LoaderConfig& cfg = loader.config();
  const auto n = static_cast<std::int64_t>(tokens.size());
  const std::int64_t stored = loader.stored_prefix(compute, store, tokens);
  const auto keys = prefix_chunk_keys(compute.model_fingerprint(), tokens, cfg.fetch_chunk);
  detail::CakeRace race(cfg, loader.estimate(), stored, n);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [t0] { return std::chrono::duration<double>(clock::now() - t0).count(); };

  std::mutex m;
  std::condition_variable cv;
  double fetch_start = detail::kNoFetch;
  std::map<std::int64_t, KVBlock> loaded;
  std::exception_ptr compute_error;

  std::thread io_thread([&] {
    std::unique_lock lock(m);
    while (auto r = race.next_fetch()) {
      detail::cake_io_step(race, store, keys, cfg.fetch_chunk, *r, loaded, fetch_start, lock, since);
      cv.notify_all();
    }
  });

  // Compute worker: this thread.
  double gpu_free = 0;
  {
    std::unique_lock lock(m);
    for (;;) {
      TokenRange r;
      const auto decision = race.decide_compute(since(), fetch_start, r);
      if (decision == detail::CakeRace::Decision::done) break;
      if (decision != detail::CakeRace::Decision::start) {
        cv.wait_for(lock, std::chrono::milliseconds(1));
        continue;
      }
      race.compute_started(since());
      const double start = since();
      lock.unlock();
      try {
        compute.compute_kv(r);
      } catch (...) {
        compute_error = std::current_exception();
      }
      lock.lock();
      if (compute_error) {
        race.stop_loads();
        break;
      }
      gpu_free = since();
      race.compute_done(r, start, gpu_free);
    }
  }
  // Covered (or the compute side failed). A fetch still in flight cannot be cancelled (KVStore::get blocks): it
  // finishes on the I/O thread while the blocks already loaded are installed and the tokens after the stored
  // prefix are computed, and is recorded as abandoned.
  std::vector<std::pair<TokenRange, KVBlock>> to_install;
  {
    std::lock_guard lock(m);
    if (!compute_error) to_install = detail::cake_take_loaded(race, loaded);
  }
  if (compute_error) {
    io_thread.join();
    std::rethrow_exception(compute_error);
  }
  double ready = 0;
  try {
    for (const auto& [r, block] : to_install) compute.install_kv(r, block);
    ready = detail::cake_compute_after_prefix(
        stored, n, cfg.compute_chunk, since(),
        [&](TokenRange r, double) {
          compute.compute_kv(r);
          return since();
        },
        [&](TokenRange r, double start, double end) {
          std::lock_guard lock(m);
          race.compute_done(r, start, end);
        });
    ready = std::max(ready, since());
  } catch (...) {
    io_thread.join();
    throw;
  }
  io_thread.join();
  return race.finish(ready);
}

}  // namespace kvfuse
