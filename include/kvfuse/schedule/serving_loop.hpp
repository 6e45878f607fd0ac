#pragma once
// serve — Cake's adaptive scheduling mode in an engine's step loop (Cake, ICML 2025: §3 part 3, §5.4 and
// appendix B): several requests, each on its own engine, sharing one token budget per step and one store, on
// real threads and the steady clock.
//
// What it does: runs engine steps until every request has its prompt's KV and its tokens. Each step,
// TokenBudgetScheduler splits the budget — one token to every decoding request, then chunked prefill of
// requests without a prefix-cache hit (first come, first served), then what is left to the compute side of Cake
// requests — and serve runs that plan on the requests' engines, in the plan's order. A request whose prompt has
// stored prefix-cache entries (prefix_chunk_keys, BidirectionalLoader::stored_prefix) is a Cake request: the
// I/O thread loads its stored prefix from the back (Cake §4: run_threaded's race, detail::CakeRace, with the
// loader's mode and fallbacks) while its compute side advances from the front only with the tokens the
// scheduler gives it. Where the two meet, its loaded KV is installed and the tokens after the stored prefix are
// ordinary chunked prefill. The step whose prefill computes a prompt's last token also samples the request's
// first token (as vLLM does); each later step decodes one more, greedily (DecodingBackend::decode_step).
//
// When to use it: to serve Cake requests next to other traffic on engines without a step loop of their own (the
// reference CPU backend, tests, measurements), and as the reference of what an engine's own step loop does
// with TokenBudgetScheduler and the loader (docs/integration.md). ServingTrace holds everything it decided.
//
// Choices:
// - One I/O thread per loop serves the Cake requests' fetches in arrival order, each request's from the back,
//   as Cake's integration does (appendix B: one asynchronous get worker reading chunk keys from a queue into
//   which each request's keys are pushed in reverse order). The requests share the store's link anyway:
//   loading two at once would halve the first one's bandwidth and delay its meeting point for nothing, and a
//   KVStore promises safety for one reader thread only. A request's loader predicts its loads as if they ran
//   now, not behind an earlier request's; in LoaderMode::adaptive the idle budget bounds what that costs.
// - A Cake request's allocation is an upper bound: its compute side computes up to where its loads are when its
//   turn in the step comes, so a load that landed meanwhile shortens the chunk (StepWork::computed says what
//   ran). A Cake request asks for no tokens while its loader would not start a chunk (adaptive wait, load-only,
//   static split), and the budget goes to the next one. The loader's compute_chunk is only the unit of its
//   predictions here: give it the scheduler's budget.
// - A stored prefix covering the whole prompt is cut back to the fetch boundary before the last token, so every
//   prompt ends with a computed chunk whose logits give the first token (vLLM computes the last token of a full
//   prefix hit too).
// - Every request is there from the first step, in the order of `requests` (their arrival order); the
//   prefix-cache lookups are made before the I/O thread starts.
//
// Failures: a load that misses, throws or returns a wrong-sized block stops that request's loads and its
// compute side covers the rest (ServedRequestTrace::loader.load_failure); an exception of an engine stops the
// loads and is rethrown once the I/O thread has been joined.
//
// Thread safety: the engines are used by the calling thread only; `store` by the calling thread (contains)
// before the loads start, then by the I/O thread only (get) until serve returns.

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/keys.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"
#include "kvfuse/schedule/threaded_loader.hpp"
#include "kvfuse/schedule/token_budget_scheduler.hpp"

namespace kvfuse {

// What serve needs of a request's engine beyond ComputeBackend: greedy decoding, one token per call. The first
// call (the whole prompt's KV resident) returns the most likely token after the prompt; each later call computes
// the KV of the token it returned last (one decode step) and returns the most likely token after that.
template <class E>
concept DecodingBackend = ComputeBackend<E> && requires(E& e) {
  { e.decode_step() } -> std::same_as<token_id>;
};

template <DecodingBackend Engine>
struct ServedRequest {
  std::uint64_t id = 0;
  Engine engine;                   // this request's model: its prompt's KV, then its decoding
  std::vector<token_id> prompt;    // the tokens the engine holds (the prefix-cache keys hash them)
  std::int64_t decode_tokens = 0;  // tokens to generate: the first after the prompt's last chunk, then one per step
};

// One allocation of a step's plan, as it ran.
struct StepWork {
  std::uint64_t id = 0;
  BudgetUse use = BudgetUse::decode;
  TokenRange computed{};          // prompt tokens computed: the allocation's, or fewer (even none) for a Cake
                                  // request whose loads moved meanwhile; empty for a decode
  std::optional<token_id> token;  // the token sampled: a decode's, or the first, after the prompt's last chunk
};

// A stored chunk a Cake request's loads made resident (on the I/O thread).
struct LandedLoad {
  std::uint64_t id = 0;
  TokenRange tokens{};
};

struct ServingStep {
  double start_s = 0;                   // seconds since serve started
  double end_s = 0;
  std::vector<std::uint64_t> met;       // Cake requests whose two sides had met: their loaded KV was installed
                                        // before this step, the rest of their prompt is plain prefill
  std::vector<std::uint64_t> decoding;  // the scheduler's input: decoding requests, in arrival order,
  std::vector<PrefillRequest> waiting;  // and prefilling ones (a Cake request's remaining_tokens: what its
                                        // compute side may compute now; 0 while its loader waits)
  StepPlan plan;                        // the scheduler's output
  std::vector<StepWork> work;           // one per allocation, in the plan's order
  std::vector<LandedLoad> landed;       // loads that landed since the previous step ended, up to this one's end
};

struct ServedRequestTrace {
  std::uint64_t id = 0;
  LoaderTrace loader;                  // how its prompt's KV was made, as run_threaded reports it: stored prefix
                                       // (> 0: a Cake request), meet_token, tokens computed vs loaded, every chunk
                                       // and load with its times (s since serve started), load_failure
  std::int64_t first_token_step = -1;  // the step that sampled its first token (-1: it decodes none)
  double ttft_ms = 0;                  // when, in ms since serve started
  std::int64_t last_step = -1;         // the step it finished in
  std::vector<token_id> tokens;        // its greedy tokens
};

struct ServingTrace {
  std::vector<ServingStep> steps;
  std::vector<ServedRequestTrace> requests;  // in the order of the requests
};

namespace detail {

// One request's progress in serve; the race (a plain request's has no stored prefix) and the loads are
// guarded by serve's mutex.
struct ServedState {
  enum class Phase { loading, prefill, decode, done };
  std::uint64_t id = 0;
  CakeRace race;
  std::vector<KVKey> keys;  // prefix-cache keys of the prompt
  std::map<std::int64_t, KVBlock> loaded;
  double fetch_start = kNoFetch;
  std::int64_t stored = 0;
  std::int64_t next = 0;    // prefill: the first prompt token not computed yet
  Phase phase = Phase::prefill;
  double ready_s = 0;       // when the prompt's KV was complete
};

}  // namespace detail

// Serves `requests` to completion: each one's prompt KV (Cake requests' stored prefixes loaded as `loader`
// decides) and its decode_tokens greedy tokens, in steps planned by `scheduler`. Refuses duplicate ids, empty
// prompts and negative decode counts before anything runs.
template <DecodingBackend Engine, KVStore Store>
ServingTrace serve(const TokenBudgetScheduler& scheduler, const BidirectionalLoader<Engine, Store>& loader,
                   std::vector<ServedRequest<Engine>>& requests, Store& store) {
  using Phase = detail::ServedState::Phase;
  const LoaderConfig& cfg = loader.config();
  std::map<std::uint64_t, std::size_t> index_of;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const ServedRequest<Engine>& q = requests[i];
    detail::require(!q.prompt.empty(), "serve: request {} has an empty prompt", q.id);
    detail::require(q.decode_tokens >= 0, "serve: request {} has decode_tokens = {}, must be >= 0", q.id,
                    q.decode_tokens);
    const auto [at, fresh] = index_of.emplace(q.id, i);
    detail::require(fresh, "serve: request id {} is used twice (requests {} and {})", q.id, at->second, i);
  }

  std::vector<detail::ServedState> state;
  state.reserve(requests.size());
  ServingTrace trace;
  trace.requests.resize(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    ServedRequest<Engine>& q = requests[i];
    const auto n = static_cast<std::int64_t>(q.prompt.size());
    std::int64_t stored = loader.stored_prefix(q.engine, store, q.prompt);
    if (stored == n) stored = (n - 1) / cfg.fetch_chunk * cfg.fetch_chunk;  // the last token is computed
    state.push_back({q.id, detail::CakeRace(cfg, loader.estimate(), stored, n),
                     prefix_chunk_keys(q.engine.model_fingerprint(), q.prompt, cfg.fetch_chunk), {}, detail::kNoFetch,
                     stored, 0, stored > 0 ? Phase::loading : Phase::prefill, 0.0});
    trace.requests[i].id = q.id;
  }

  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [t0] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  std::mutex m;
  std::condition_variable cv;
  std::vector<LandedLoad> landed;  // since the last step ended

  // The I/O thread: the next chunk of the first request in arrival order that has one to load. A request that
  // has none now never will again (its sides met, or its loads stopped), so the thread ends with the last one.
  std::thread io_thread([&] {
    std::unique_lock lock(m);
    for (;;) {
      std::optional<TokenRange> r;
      std::size_t i = 0;
      while (i < state.size() && !(r = state[i].race.next_fetch())) ++i;
      if (!r) return;
      detail::ServedState& s = state[i];
      if (detail::cake_io_step(s.race, store, s.keys, cfg.fetch_chunk, *r, s.loaded, s.fetch_start, lock, since))
        landed.push_back({s.id, *r});
      cv.notify_all();
    }
  });

  try {
    std::size_t unfinished = requests.size();
    while (unfinished > 0) {
      ServingStep step;
      step.start_s = since();
      const auto step_index = static_cast<std::int64_t>(trace.steps.size());
      // Cake requests whose sides met: install what was loaded; the rest of the prompt is plain prefill.
      for (std::size_t i = 0; i < state.size(); ++i) {
        detail::ServedState& s = state[i];
        if (s.phase != Phase::loading) continue;
        std::vector<std::pair<TokenRange, KVBlock>> blocks;
        {
          std::lock_guard lock(m);
          if (!s.race.covered()) continue;
          blocks = detail::cake_take_loaded(s.race, s.loaded);
        }
        for (const auto& [r, block] : blocks) requests[i].engine.install_kv(r, block);
        s.phase = Phase::prefill;
        s.next = s.stored;
        step.met.push_back(s.id);
      }
      {
        std::lock_guard lock(m);
        const double now = since();
        for (std::size_t i = 0; i < state.size(); ++i) {
          detail::ServedState& s = state[i];
          if (s.phase == Phase::decode) step.decoding.push_back(s.id);
          if (s.phase == Phase::prefill)
            step.waiting.push_back({s.id, static_cast<std::int64_t>(requests[i].prompt.size()) - s.next, false});
          if (s.phase == Phase::loading) {
            TokenRange grid;  // the loader's own chunk; the scheduler sizes this one
            const bool start = s.race.decide_compute(now, s.fetch_start, grid) == detail::CakeRace::Decision::start;
            step.waiting.push_back({s.id, start ? s.race.compute_end() - s.race.computed() : 0, true});
          }
        }
      }
      step.plan = scheduler.plan_step(step.decoding, step.waiting);
      if (step.plan.allocations.empty()) {  // only Cake requests, each waiting for its loads
        std::unique_lock lock(m);
        cv.wait_for(lock, std::chrono::milliseconds(1));
        continue;
      }

      for (const BudgetAllocation& a : step.plan.allocations) {
        const std::size_t i = index_of.at(a.id);
        ServedRequest<Engine>& q = requests[i];
        detail::ServedState& s = state[i];
        ServedRequestTrace& out = trace.requests[i];
        StepWork w{a.id, a.use, {}, std::nullopt};
        bool prompt_done = false;
        if (a.use == BudgetUse::decode) {
          w.token = q.engine.decode_step();
        } else {
          TokenRange r;
          if (a.use == BudgetUse::cached_prefill) {
            std::lock_guard lock(m);
            const std::int64_t c = s.race.computed();
            r = {c, std::max(c, std::min(c + a.tokens, s.race.compute_end()))};
            if (!r.empty()) s.race.compute_started(since());
          } else {
            r = {s.next, s.next + a.tokens};
          }
          if (!r.empty()) {
            const double start = since();
            q.engine.compute_kv(r);
            const double end = since();
            std::lock_guard lock(m);
            s.race.compute_done(r, start, end);
            s.ready_s = end;  // the last chunk's end is when the prompt's KV is complete
            w.computed = r;
          }
          if (a.use == BudgetUse::prefill) {
            s.next = r.end;
            if (r.end == static_cast<std::int64_t>(q.prompt.size())) {
              prompt_done = true;
              if (q.decode_tokens > 0) w.token = q.engine.decode_step();
            }
          }
        }
        if (w.token) {
          if (out.tokens.empty()) {
            out.first_token_step = step_index;
            out.ttft_ms = since() * 1e3;
          }
          out.tokens.push_back(*w.token);
        }
        if (prompt_done || a.use == BudgetUse::decode) {
          s.phase = static_cast<std::int64_t>(out.tokens.size()) == q.decode_tokens ? Phase::done : Phase::decode;
          if (s.phase == Phase::done) {
            out.last_step = step_index;
            --unfinished;
          }
        }
        step.work.push_back(w);
      }
      step.end_s = since();
      {
        std::lock_guard lock(m);
        step.landed = std::exchange(landed, {});
      }
      trace.steps.push_back(std::move(step));
    }
  } catch (...) {
    {
      std::lock_guard lock(m);
      for (detail::ServedState& s : state) s.race.stop_loads();
    }
    io_thread.join();
    throw;
  }
  io_thread.join();
  for (std::size_t i = 0; i < state.size(); ++i) trace.requests[i].loader = state[i].race.finish(state[i].ready_s);
  return trace;
}

}  // namespace kvfuse
