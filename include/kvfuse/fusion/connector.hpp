#pragma once
// FusionConnector: kvfuse's fusion methods for an engine that owns its step loop and batches across requests —
// the shape of vLLM's KV connector (KVConnectorBase_V1), with the hook vLLM lacks: which rows each layer recomputes.
//
// Scheduler side (no side effects, never waits for a running request):
//   plan(request, tokens, layout, method[, variants])
//                                            -> FusionPlan: each chunk's source and store entry, the shift, S_0,
//                                              whether S_l changes per layer and the statistics its policy reads,
//                                              the bytes to read (plan_fusion, fusion/planner.hpp)
// Worker side, per request, called by the engine's forward pass for every request of a batch:
//   start(plan, method[, LoadStart])         -> Status: the request's stored entries start loading on the I/O
//                                              threads, a layer at a time (Cache-Craft §3.4.2, Algorithm 2: layer j
//                                              once layer j − L_p − 1 is taken; vLLM: start_load_kv); LoadStart
//                                              sets the request's own L_p, timeout and Algorithm 2's preload, and
//                                              hands over entry headers the caller already checked (entry_fits)
//   wait_for_layer(request, l)               -> LayerLoad: before layer l reads the request's KV — success and the
//                                              bytes of layer l of each loaded chunk (the engine installs them and
//                                              RoPE-shifts K by ChunkPlan::shift()), or the status of a failed or
//                                              timed-out read (vLLM: wait_for_layer_load)
//   after_layer(request, report, next)       -> Status: S_{l+1} from the statistics the plan named (CacheBlend's
//                                              gradual filtering, QueryAware, Cache-Craft's focus termination)
//   second_pass(request, rows)               -> Status: after the last layer of a two-pass plan (FusionPlan::two_pass,
//                                              QueryProbe), the rows the engine then recomputes on every layer over
//                                              the same KV, a fixed set without hooks, whose logits are the result
//                                              (none: the probe pass's logits are)
//   failure(request)                         -> ReadFailure: after a failed read, why and which chunks
//   recover(request)                         -> FusionPlan: after a failed read, the plan with the failed chunks
//                                              computed instead; start it again (only this request's rows change)
//   finish(request)                          -> the request's buffers freed (also on cancellation);
//   finish_and_wait(request)                    the same, returning once no I/O thread reads for it any more
//   save(key, block[, tier])                 -> asynchronous put on the I/O threads (vLLM: save_kv_layer);
//   finished_saves() / wait_for_saves()         completions since the last call / block until all are done
//                                              (vLLM: get_finished / wait_for_save)
// Nothing throws through the engine's forward pass: wait_for_layer and after_layer return statuses, a store's
// exception becomes the request's status (store_unavailable or corrupt_entry by kvfuse::error::code()).
//
// One I/O executor per connector (per engine): Config::io_threads persistent threads shared by every request,
// reading layers straight into buffers the connector holds per request (RangedKVStore::get_into; at most L_p + 1
// layers of a request at a time),
// then saves. Requests are served in the order they started; a stalled read holds one thread, not the others.
//
// Cache-Craft variants: the connector keeps no VariantCache; plan() chooses from the VariantIndex of a caller that
// keeps one (CpuBatchEngine; FusionPipeline plans with plan_fusion itself), and the plan loads its variant chunks
// like any other entry: a variant is a stored block read layer by layer at its recorded positions, and one the
// cache evicted (and erased) mid-request is a failed read like any other, computed instead.
//
// Thread safety: every member may be called from any thread; calls for one request come from one thread at a time
// (the engine's step). The store must be safe for concurrent use (every kvfuse store is).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/status.hpp"
#include "kvfuse/core/types.hpp"
#include "kvfuse/fusion/fusion_method.hpp"
#include "kvfuse/fusion/layer_protocol.hpp"
#include "kvfuse/fusion/layer_schedule.hpp"
#include "kvfuse/fusion/planner.hpp"

namespace kvfuse {

struct ConnectorConfig {
  std::int64_t preload_depth = 2;  // L_p: layers of a request read ahead of the one its engine waits for (eq. 16)
  double layer_timeout_ms = 0.0;   // a layer not in this long after the engine asked fails the request's read; 0: wait
  int io_threads = 2;              // the I/O executor's threads, shared by every request

  void validate() const {
    detail::require(preload_depth >= 1, "ConnectorConfig: preload_depth = {} must be >= 1", preload_depth);
    detail::require_finite_nonneg(layer_timeout_ms, "ConnectorConfig: layer_timeout_ms");
    detail::require(io_threads >= 1, "ConnectorConfig: io_threads = {} must be >= 1", io_threads);
  }
};

// Per-request settings of start; the defaults are the connector's.
struct LoadStart {
  std::int64_t preload_depth = 0;          // L_p of this request (eq. 16); 0: ConnectorConfig::preload_depth
  std::optional<double> layer_timeout_ms;  // of this request (0: wait); none: ConnectorConfig::layer_timeout_ms
  // Algorithm 2's preload: wait_for_layer(request, 0) returns once layers 0 .. L_p − 1 are read (a single-request
  // driver starts computing behind L_p layers, as in Cache-Craft §3.4.2); false: once layer 0 is.
  bool preload = false;
  // The headers of the request's entries, described and checked by the caller (entry_fits), one per chunk it loads
  // in plan order; empty: an I/O thread describes and checks them before it reads layer 0.
  std::vector<KVBlockInfo> described;
};

// Whether a stored entry's header fits a planned chunk: its token count, the position its K was rotated at, and the
// bytes of the engine's block of that many rows.
[[nodiscard]] inline bool entry_fits(const KVBlockInfo& info, const ChunkPlan& c, std::uint64_t block_bytes) noexcept {
  return info.num_tokens == c.range.size() && info.first_position == c.stored_first_position &&
         info.bytes == block_bytes;
}

// Layer l of one loaded chunk: install `bytes` (StoredLayer layout of the engine) as rows `rows`, rotated at
// stored_first_position + (0 .. rows.size() − 1), then shift K by rows.begin − stored_first_position.
struct LayerPiece {
  TokenRange rows;
  std::int64_t stored_first_position = 0;
  std::span<const std::byte> bytes;
};

// What wait_for_layer returns: the pieces stay valid until the request's next wait_for_layer or finish.
struct LayerLoad {
  Status status = Status::success;
  std::span<const LayerPiece> pieces;
  double waited_ms = 0.0;  // blocked for a layer still being read (load time the engine sees)
  double read_ms = 0.0;    // the I/O thread's time reading layer l of the request's entries (store time)
};

// Why a request's read failed: the status wait_for_layer returned, the reason, and the plan's chunks whose entries
// failed (recover computes them instead).
struct ReadFailure {
  Status status = Status::success;
  std::string why;
  std::vector<std::size_t> chunks;
};

struct SaveResult {
  KVKey key;
  Status status = Status::success;
  std::string why;  // when status != success
};

template <RangedKVStore Store>
class FusionConnector {
 public:
  FusionConnector(Store& store, EngineShape shape, ConnectorConfig config = {})
      : store_(&store), shape_(shape), config_(config) {
    config_.validate();
    detail::require(shape_.num_layers >= 1 && shape_.layer_bytes_per_row > 0,
                    "FusionConnector: engine shape of {} layers, {} bytes per row and layer", shape_.num_layers,
                    shape_.layer_bytes_per_row);
    for (int t = 0; t < config_.io_threads; ++t) threads_.emplace_back([this] { io_loop(); });
  }
  FusionConnector(const FusionConnector&) = delete;
  FusionConnector& operator=(const FusionConnector&) = delete;
  ~FusionConnector() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    work_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  [[nodiscard]] const EngineShape& shape() const noexcept { return shape_; }
  [[nodiscard]] const ConnectorConfig& config() const noexcept { return config_; }

  // Scheduler side: the plan of `method` for this request from what the store holds now (and, for Cache-Craft, the
  // variants the caller keeps); no side effects.
  [[nodiscard]] FusionPlan plan(std::uint64_t request, std::span<const token_id> tokens, const PromptLayout& layout,
                                const FusionMethod& method, VariantIndex variants = {}) const {
    return plan_fusion(request, tokens, layout, method, shape_, *store_, variants);
  }

  // Registers the request of `plan` and starts reading its entries (every chunk not computed, with bytes to read).
  // invalid_argument (last_status_message names it) for a request already started, a plan of another shape or
  // settings that do not fit it.
  Status start(const FusionPlan& plan, const FusionMethod& method, LoadStart settings = {}) {
    auto r = std::make_shared<Request>();
    r->plan = plan;
    r->depth = settings.preload_depth > 0 ? settings.preload_depth : config_.preload_depth;
    r->timeout_ms = settings.layer_timeout_ms.value_or(config_.layer_timeout_ms);
    r->preload = settings.preload;
    if (settings.preload_depth < 0 || !(r->timeout_ms >= 0.0))
      return refuse(Status::invalid_argument, "FusionConnector::start: request %llu: L_p = %lld, timeout %g ms",
                    static_cast<unsigned long long>(plan.request_id), static_cast<long long>(settings.preload_depth),
                    r->timeout_ms);
    try {
      r->schedule = layer_schedule(plan, method, shape_.num_layers);
    } catch (const error& e) {
      return refuse(e.code(), "FusionConnector::start: request %llu: %s",
                    static_cast<unsigned long long>(plan.request_id), e.what());
    }
    if (plan.method != method_name(method))
      return refuse(Status::invalid_argument, "FusionConnector::start: request %llu was planned for '%s', not '%s'",
                    static_cast<unsigned long long>(plan.request_id), plan.method.c_str(),
                    method_name(method).c_str());
    for (std::size_t j = 0; j < plan.chunks.size(); ++j) {
      const ChunkPlan& c = plan.chunks[j];
      if (c.source == KVSource::compute || c.bytes == 0) continue;
      r->streams.push_back(j);
      r->layer_bytes += shape_.layer_bytes(c.range.size());
    }
    if (!settings.described.empty()) {
      if (settings.described.size() != r->streams.size())
        return refuse(Status::invalid_argument, "FusionConnector::start: request %llu: %zu headers for %zu entries",
                      static_cast<unsigned long long>(plan.request_id), settings.described.size(), r->streams.size());
      r->infos = std::move(settings.described);
      r->described = true;
    }
    const auto layers = static_cast<std::size_t>(shape_.num_layers);
    r->layers.resize(layers);
    r->ready.assign(layers, 0);
    r->read_ms.assign(layers, 0.0);
    r->pieces.resize(r->streams.size());
    {
      std::lock_guard lock(mutex_);
      if (requests_.count(plan.request_id) != 0)
        return refuse(Status::invalid_argument, "FusionConnector::start: request %llu has already started",
                      static_cast<unsigned long long>(plan.request_id));
      requests_.emplace(plan.request_id, r);
      order_.push_back(plan.request_id);
    }
    work_.notify_all();
    return Status::success;
  }

  // Before layer `layer` reads the request's KV (layers in order, once each).
  LayerLoad wait_for_layer(std::uint64_t request, std::int64_t layer) {
    std::unique_lock lock(mutex_);
    const auto it = requests_.find(request);
    if (it == requests_.end()) {
      return {refuse(Status::invalid_argument, "FusionConnector::wait_for_layer: request %llu has not started",
                     static_cast<unsigned long long>(request)),
              {}};
    }
    Request& r = *it->second;
    const auto l = static_cast<std::size_t>(layer);
    if (layer < 0 || layer >= shape_.num_layers)
      return {refuse(Status::invalid_argument, "FusionConnector::wait_for_layer: layer %lld of %lld",
                     static_cast<long long>(layer), static_cast<long long>(shape_.num_layers)),
              {}};
    if (l > 0 && l - 1 < r.layers.size()) std::vector<std::byte>().swap(r.layers[l - 1]);  // layer l − 1 is done
    r.taken = layer;
    work_.notify_all();
    if (r.streams.empty()) return {Status::success, {}};
    const std::size_t until =
        l == 0 && r.preload ? static_cast<std::size_t>(std::min(r.depth, shape_.num_layers)) - 1 : l;
    const auto done = [&] { return r.ready[until] != 0 || r.failure != Status::success; };
    const auto blocked = std::chrono::steady_clock::now();
    if (r.timeout_ms > 0) {
      const auto limit = std::chrono::duration<double, std::milli>(r.timeout_ms);
      if (!work_done_.wait_for(lock, limit, done)) {
        r.failure = Status::store_unavailable;
        r.why = fmt::format("layer {} did not arrive within {} ms", until, r.timeout_ms);
        if (r.reading) {  // the entry whose read stalls is computed instead
          r.failed_streams = {r.stream.load()};
        } else {  // no thread got to the request yet: which entry stalls is not known, every one is computed
          r.failed_streams.resize(r.streams.size());
          for (std::size_t s = 0; s < r.streams.size(); ++s) r.failed_streams[s] = s;
        }
      }
    } else {
      work_done_.wait(lock, done);
    }
    const double waited = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - blocked).count();
    if (r.failure != Status::success) {
      std::string rows;
      for (std::size_t s : r.failed_streams)
        rows += fmt::format("{}{}", rows.empty() ? "" : ", ", r.plan.chunks[r.streams[s]].range);
      return {refuse(r.failure, "FusionConnector: request %llu, rows %s: %s", static_cast<unsigned long long>(request),
                     rows.c_str(), r.why.c_str()),
              {},
              waited};
    }
    std::size_t offset = 0;
    for (std::size_t s = 0; s < r.streams.size(); ++s) {
      const ChunkPlan& c = r.plan.chunks[r.streams[s]];
      const std::size_t bytes = shape_.layer_bytes(c.range.size());
      r.pieces[s] = {c.range, c.stored_first_position, std::span<const std::byte>(r.layers[l]).subspan(offset, bytes)};
      offset += bytes;
    }
    return {Status::success, r.pieces, waited, r.read_ms[l]};
  }

  // After layer report.layer: S_{l+1} into `next` (empty: S_l kept) by the plan's per-layer policy.
  Status after_layer(std::uint64_t request, const LayerReport& report, TokenSet& next) {
    std::shared_ptr<Request> r = find(request);
    if (!r) {
      return refuse(Status::invalid_argument, "FusionConnector::after_layer: request %llu has not started",
                    static_cast<unsigned long long>(request));
    }
    if (!r->schedule.next) return Status::success;
    try {
      next = r->schedule.next(report);
    } catch (const error& e) {
      return refuse(e.code(), "FusionConnector::after_layer: request %llu, layer %lld: %s",
                    static_cast<unsigned long long>(request), static_cast<long long>(report.layer), e.what());
    }
    return Status::success;
  }

  // After the last layer of a two-pass plan (FusionPlan::two_pass): the rows of its second pass into `rows`.
  // invalid_argument for a request not started, a one-pass plan, or a probe pass whose last layer has not run.
  Status second_pass(std::uint64_t request, TokenSet& rows) const {
    std::shared_ptr<Request> r = find(request);
    if (!r || !r->schedule.second_pass || !r->schedule.second_pass->has_value())
      return refuse(Status::invalid_argument,
                    "FusionConnector::second_pass: request %llu %s", static_cast<unsigned long long>(request),
                    !r                          ? "has not started"
                    : !r->schedule.second_pass ? "has a one-pass plan"
                                                : "has not run the last layer of its probe pass");
    rows = **r->schedule.second_pass;
    return Status::success;
  }

  // After a failed read (a wait_for_layer that did not succeed): why, and the chunks whose reads failed.
  [[nodiscard]] ReadFailure failure(std::uint64_t request) const {
    std::lock_guard lock(mutex_);
    const auto it = requests_.find(request);
    detail::require(it != requests_.end(), "FusionConnector::failure: request {} has not started", request);
    const Request& r = *it->second;
    ReadFailure out{r.failure, r.why, {}};
    for (std::size_t s : r.failed_streams) out.chunks.push_back(r.streams[s]);
    return out;
  }

  // After a failed read: the request's plan with every chunk whose read failed computed instead (S_0 anew). The
  // request's state is dropped; start the returned plan to run it again.
  [[nodiscard]] FusionPlan recover(std::uint64_t request, const FusionMethod& method) {
    std::shared_ptr<Request> r = find(request);
    detail::require(r != nullptr, "FusionConnector::recover: request {} has not started", request);
    FusionPlan plan;
    {
      std::lock_guard lock(mutex_);
      plan = r->plan;
      for (std::size_t s : r->failed_streams) {
        ChunkPlan& c = plan.chunks[r->streams[s]];
        c.source = KVSource::compute;
        c.key = {};
        c.recompute.clear();
      }
    }
    finish(request);
    finish_plan(plan, method, shape_);
    return plan;
  }

  // The request is done (or cancelled): its buffers are freed; a read in flight finishes into nothing.
  void finish(std::uint64_t request) {
    std::lock_guard lock(mutex_);
    const auto it = requests_.find(request);
    if (it == requests_.end()) return;
    it->second->cancelled = true;
    requests_.erase(it);
    std::erase(order_, request);
  }

  // finish(request), returning once no I/O thread reads for the request any more: a stalled read holds its thread
  // until the store gives up (its own timeout bounds it), and a caller that retries at once would otherwise count
  // that stall against the retry's own layer timeout.
  void finish_and_wait(std::uint64_t request) {
    std::unique_lock lock(mutex_);
    const auto it = requests_.find(request);
    if (it == requests_.end()) return;
    const std::shared_ptr<Request> r = it->second;
    r->cancelled = true;
    requests_.erase(it);
    std::erase(order_, request);
    work_done_.wait(lock, [&] { return !r->reading; });
  }

  // Asynchronous put on the I/O threads; `tier` where the store takes one (TieredKVStore: that tier and slower).
  void save(KVKey key, KVBlock block, std::size_t tier = 0) {
    {
      std::lock_guard lock(mutex_);
      saves_.push_back({key, std::move(block), tier});
      ++saves_pending_;
    }
    work_.notify_all();
  }

  // Saves completed since the last call, in completion order.
  [[nodiscard]] std::vector<SaveResult> finished_saves() {
    std::lock_guard lock(mutex_);
    return std::exchange(finished_, {});
  }

  // Blocks until every save enqueued so far has completed.
  void wait_for_saves() {
    std::unique_lock lock(mutex_);
    work_done_.wait(lock, [&] { return saves_pending_ == 0; });
  }

 private:
  struct Request {
    FusionPlan plan;
    LayerSchedule schedule;
    std::vector<std::size_t> streams;           // chunks loaded, in plan order
    std::vector<KVBlockInfo> infos;             // their entries, described before layer 0 is read
    bool described = false;                     // infos came with start (LoadStart::described)
    std::int64_t depth = 1;                     // L_p
    double timeout_ms = 0.0;                    // of a layer the engine waits for; 0: none
    bool preload = false;                       // layer 0 waits for layers 0 .. L_p − 1
    std::size_t layer_bytes = 0;                // of every stream, per layer
    std::vector<std::vector<std::byte>> layers;  // [layer] every stream's bytes, in stream order
    std::vector<std::uint8_t> ready;            // [layer] read
    std::vector<double> read_ms;                // [layer] the I/O thread's time reading it
    std::vector<LayerPiece> pieces;
    std::int64_t next_read = 0;                 // next layer to read
    std::int64_t taken = -1;                    // highest layer the engine waited for
    bool reading = false;                       // an I/O thread is reading a layer of it
    std::atomic<std::size_t> stream{0};         // the stream it reads (the one that stalls, on a timeout)
    bool cancelled = false;
    Status failure = Status::success;
    std::string why;
    std::vector<std::size_t> failed_streams;
  };

  struct Save {
    KVKey key;
    KVBlock block;
    std::size_t tier = 0;
  };

  std::shared_ptr<Request> find(std::uint64_t request) const {
    std::lock_guard lock(mutex_);
    const auto it = requests_.find(request);
    return it == requests_.end() ? nullptr : it->second;
  }

  // A layer of some request that may be read now (Algorithm 2's window), requests in start order; under the lock.
  std::shared_ptr<Request> next_readable() {
    for (std::uint64_t id : order_) {
      const std::shared_ptr<Request>& r = requests_.at(id);
      if (r->reading || r->streams.empty() || r->failure != Status::success || r->next_read >= shape_.num_layers)
        continue;
      if (r->next_read <= r->taken + r->depth) return r;
    }
    return nullptr;
  }

  void io_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
      std::shared_ptr<Request> r;
      work_.wait(lock, [&] { return stopping_ || (r = next_readable()) != nullptr || !saves_.empty(); });
      if (stopping_) return;
      if (r) {
        r->reading = true;
        const std::int64_t l = r->next_read;
        lock.unlock();
        read_layer(*r, l);
        lock.lock();
        r->reading = false;
        if (!r->cancelled && r->failure == Status::success) {
          r->ready[static_cast<std::size_t>(l)] = 1;
          ++r->next_read;
        }
      } else {
        Save s = std::move(saves_.front());
        saves_.pop_front();
        lock.unlock();
        SaveResult result = put(std::move(s));
        lock.lock();
        finished_.push_back(std::move(result));
        --saves_pending_;
      }
      work_done_.notify_all();
      work_.notify_all();
    }
  }

  // Layer l of every stream of r into its buffer; a failure is recorded in r (under the lock).
  void read_layer(Request& r, std::int64_t l) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::byte> buffer(r.layer_bytes);
    Status status = Status::success;
    std::string why;
    std::size_t s = 0;  // the stream being read (the failed one, on a failure)
    try {
      if (l == 0 && !r.described) r.infos.clear();
      std::size_t offset = 0;
      for (; s < r.streams.size(); ++s) {
        r.stream = s;
        const ChunkPlan& c = r.plan.chunks[r.streams[s]];
        if (l == 0 && !r.described) {  // the entry's header first: a missing or foreign entry fails before any layer
          std::optional<KVBlockInfo> info = store_->describe(c.key);
          if (!info || !entry_fits(*info, c, shape_.block_bytes(c.range.size()))) {
            status = Status::corrupt_entry;
            why = fmt::format("the entry is missing or does not fit ({})",
                              info ? fmt::format("{} tokens at {}, {} bytes", info->num_tokens, info->first_position,
                                                 info->bytes)
                                   : std::string("absent"));
            break;
          }
          r.infos.push_back(*info);
        }
        const std::size_t bytes = shape_.layer_bytes(c.range.size());
        if (!store_->get_into(c.key, r.infos[s], static_cast<std::uint64_t>(l) * bytes,
                              std::span<std::byte>(buffer).subspan(offset, bytes))) {
          status = Status::corrupt_entry;
          why = fmt::format("layer {} of the entry is missing, changed or corrupt", l);
          break;
        }
        offset += bytes;
      }
    } catch (const error& e) {
      status = e.code() == Status::corrupt_entry ? Status::corrupt_entry : Status::store_unavailable;
      why = fmt::format("reading layer {} failed: {}", l, e.what());
    } catch (const std::exception& e) {
      status = Status::store_unavailable;
      why = fmt::format("reading layer {} failed: {}", l, e.what());
    }
    std::lock_guard lock(mutex_);
    if (r.cancelled || r.failure != Status::success) return;
    if (status != Status::success) {
      r.failure = status;
      r.why = std::move(why);
      r.failed_streams.push_back(s);
      return;
    }
    r.layers[static_cast<std::size_t>(l)] = std::move(buffer);
    r.read_ms[static_cast<std::size_t>(l)] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

  SaveResult put(Save s) {
    SaveResult result{s.key, Status::success, {}};
    try {
      if constexpr (requires { store_->put(s.key, s.block, s.tier); }) {
        store_->put(s.key, std::move(s.block), s.tier);
      } else {
        store_->put(s.key, std::move(s.block));
      }
    } catch (const error& e) {
      result.status = e.code();
      result.why = e.what();
    } catch (const std::exception& e) {
      result.status = Status::store_unavailable;
      result.why = e.what();
    }
    return result;
  }

  Store* store_;
  EngineShape shape_;
  ConnectorConfig config_;
  mutable std::mutex mutex_;
  std::condition_variable work_;       // the I/O threads wait for work here
  std::condition_variable work_done_;  // the engine waits for layers and saves here
  std::map<std::uint64_t, std::shared_ptr<Request>> requests_;
  std::vector<std::uint64_t> order_;  // start order
  std::deque<Save> saves_;
  std::vector<SaveResult> finished_;
  std::int64_t saves_pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace kvfuse
