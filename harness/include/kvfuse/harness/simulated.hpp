#pragma once
// Simulated backends: compute and storage that run in virtual time from a cost model.
//
// Use them to plan and test schedules deterministically (the Cake simulator, loader tests, what-if
// studies) — never as proof that KV is right: they move no real tensors.
//
// Cost model (Cake, section 5: compute-only chunked prefill and I/O-only loading):
//   compute chunk i (tokens [i·C, (i+1)·C)) takes (A + B·i) seconds at 100 % GPU share; at share s it
//   progresses at rate s. A partial chunk costs its token fraction of that. Each compute call adds a fixed
//   call_s (a forward pass reads every weight once, whatever its rows), so small chunks cost more per token.
//   loading n tokens takes latency + n · kv_bytes_per_token · 8 / bandwidth seconds.
// Both rates may vary over time: a ResourceTrace is a step function of (gpu share, bandwidth).

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvfuse/backend/concepts.hpp"
#include "kvfuse/backend/in_memory_store.hpp"
#include "kvfuse/core/error.hpp"
#include "kvfuse/core/types.hpp"

namespace kvfuse {

struct TracePoint {
  double t_s = 0;             // from this time on ...
  double gpu_share = 1;       // ... the request gets this fraction of the GPU (Cake: budget share)
  double bandwidth_gbps = 0;  // ... and this storage→GPU bandwidth
};

// Piecewise-constant resource availability. The first point starts at t = 0; the last holds forever.
class ResourceTrace {
 public:
  static ResourceTrace constant(double gpu_share, double bandwidth_gbps) {
    return ResourceTrace({{0.0, gpu_share, bandwidth_gbps}});
  }

  explicit ResourceTrace(std::vector<TracePoint> points) : points_(std::move(points)) {
    detail::require(!points_.empty(), "ResourceTrace: needs at least one point");
    detail::require(points_.front().t_s == 0.0, "ResourceTrace: first point at t = {} s, must be 0", points_.front().t_s);
    for (std::size_t i = 0; i < points_.size(); ++i) {
      const TracePoint& p = points_[i];
      detail::require(std::isfinite(p.gpu_share) && p.gpu_share >= 0 && p.gpu_share <= 1,
                      "ResourceTrace: point {} has gpu share {}, must be in [0, 1]", i, p.gpu_share);
      detail::require(std::isfinite(p.bandwidth_gbps) && p.bandwidth_gbps >= 0,
                      "ResourceTrace: point {} has bandwidth {} Gbps, must be >= 0", i, p.bandwidth_gbps);
      detail::require(i == 0 || p.t_s > points_[i - 1].t_s,
                      "ResourceTrace: point {} at t = {} s is not after the previous point", i, p.t_s);
    }
  }

  // Text form, one point per line: "t_ms gpu_share bandwidth_gbps"; '#' starts a comment.
  static ResourceTrace parse(std::string_view text) {
    std::vector<TracePoint> points;
    int line_no = 0;
    while (!text.empty()) {
      ++line_no;
      const auto nl = text.find('\n');
      std::string_view line = text.substr(0, nl);
      text = nl == std::string_view::npos ? std::string_view{} : text.substr(nl + 1);
      if (const auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
      double values[3];
      int n = 0;
      for (;;) {
        while (!line.empty() && (line.front() == ' ' || line.front() == '\t' || line.front() == '\r'))
          line.remove_prefix(1);
        if (line.empty()) break;
        detail::require(n < 3, "trace line {}: more than 3 values", line_no);
        auto [end, ec] = std::from_chars(line.data(), line.data() + line.size(), values[n]);
        detail::require(ec == std::errc{}, "trace line {}: '{}' is not a number", line_no,
                        line.substr(0, line.find_first_of(" \t")));
        line.remove_prefix(static_cast<std::size_t>(end - line.data()));
        ++n;
      }
      if (n == 0) continue;
      detail::require(n == 3, "trace line {}: expected 't_ms gpu_share bandwidth_gbps', got {} values", line_no, n);
      points.push_back({values[0] / 1e3, values[1], values[2]});
    }
    return ResourceTrace(std::move(points));
  }

  [[nodiscard]] const std::vector<TracePoint>& points() const noexcept { return points_; }
  [[nodiscard]] const TracePoint& at(double t_s) const noexcept { return points_[segment(t_s)]; }

  // When `work` units are done if work starts at `start_s` and proceeds at rate(point) units/s.
  template <class Rate>
  [[nodiscard]] double finish(double start_s, double work, Rate rate) const {
    double t = start_s;
    if (work <= 0) return t;
    for (std::size_t i = segment(t);; ++i) {
      const double r = rate(points_[i]);
      const double seg_end = i + 1 < points_.size() ? points_[i + 1].t_s : std::numeric_limits<double>::infinity();
      if (r > 0 && work <= r * (seg_end - t)) return t + work / r;
      detail::require(std::isfinite(seg_end), "ResourceTrace: rate is 0 from t = {} s on; the work never finishes",
                      points_[i].t_s);
      work -= r * (seg_end - t);
      t = seg_end;
    }
  }

 private:
  // Index of the point whose step contains t_s.
  [[nodiscard]] std::size_t segment(double t_s) const noexcept {
    const auto after = std::upper_bound(points_.begin() + 1, points_.end(), t_s,
                                        [](double t, const TracePoint& p) { return t < p.t_s; });
    return static_cast<std::size_t>(after - points_.begin()) - 1;
  }

  std::vector<TracePoint> points_;
};

// Compute cost: chunk i of `chunk_tokens` tokens costs a_s + b_s·i seconds at full GPU share, plus call_s per
// compute call.
struct ComputeCostModel {
  double a_s = 0;
  double b_s = 0;
  std::int64_t chunk_tokens = 512;
  double call_s = 0;

  void validate() const {
    detail::require_finite_nonneg(a_s, "ComputeCostModel: a_s");
    detail::require_finite_nonneg(b_s, "ComputeCostModel: b_s");
    detail::require_finite_nonneg(call_s, "ComputeCostModel: call_s");
    detail::require(a_s + b_s > 0, "ComputeCostModel: a = b = 0 would make compute free");
    detail::require(chunk_tokens > 0, "ComputeCostModel: chunk_tokens = {} must be > 0", chunk_tokens);
  }

  // Seconds at full share to compute tokens r given the KV of [0, r.begin), in one call: call_s, plus for each
  // piece of r inside grid chunk i its token fraction of (a + b·i).
  [[nodiscard]] double work_s(TokenRange r) const {
    double w = r.empty() ? 0 : call_s;
    for (std::int64_t b = r.begin; b < r.end;) {
      const TokenRange piece = grid_chunk(b, r.end, chunk_tokens);
      const auto i = static_cast<double>(b / chunk_tokens);
      w += (a_s + b_s * i) * static_cast<double>(piece.size()) / static_cast<double>(chunk_tokens);
      b = piece.end;
    }
    return w;
  }
};

// ComputeBackend in virtual time. It tracks which tokens hold KV and refuses to compute a range whose
// prefix is not resident, so a wrong schedule fails loudly.
class SimulatedCompute {
 public:
  SimulatedCompute(ComputeCostModel cost, ResourceTrace trace, std::uint64_t model = 0x51u)
      : cost_(cost), trace_(std::move(trace)), model_(model) {
    cost_.validate();
  }

  [[nodiscard]] std::uint64_t model_fingerprint() const noexcept { return model_; }

  void compute_kv(TokenRange r) {
    detail::require(r.begin >= 0 && !r.empty(), "SimulatedCompute: compute of empty or negative range {}", r);
    detail::require(resident_prefix() >= r.begin,
                    "SimulatedCompute: compute of {} needs KV of [0, {}) but only [0, {}) is resident", r, r.begin,
                    resident_prefix());
    mark(r);
  }
  void install_kv(TokenRange r, const KVBlock& block) {
    detail::require(block.num_tokens == r.size(), "SimulatedCompute: install of {} got a block of {} tokens", r,
                    block.num_tokens);
    mark(r);
  }

  [[nodiscard]] double compute_finish_s(TokenRange r, double start_s) const {
    return trace_.finish(start_s, cost_.work_s(r), [](const TracePoint& p) { return p.gpu_share; });
  }

  // Length of the longest resident prefix [0, n).
  [[nodiscard]] std::int64_t resident_prefix() const noexcept { return prefix_; }

  [[nodiscard]] const ComputeCostModel& cost() const noexcept { return cost_; }
  [[nodiscard]] const ResourceTrace& trace() const noexcept { return trace_; }

 private:
  void mark(TokenRange r) {
    if (resident_.size() < static_cast<std::size_t>(r.end)) resident_.resize(static_cast<std::size_t>(r.end), false);
    for (std::int64_t t = r.begin; t < r.end; ++t) resident_[static_cast<std::size_t>(t)] = true;
    while (static_cast<std::size_t>(prefix_) < resident_.size() && resident_[static_cast<std::size_t>(prefix_)])
      ++prefix_;
  }

  ComputeCostModel cost_;
  ResourceTrace trace_;
  std::uint64_t model_;
  std::vector<bool> resident_;
  std::int64_t prefix_ = 0;  // resident_prefix(), kept up to date by mark()
};

struct LinkCostModel {
  double latency_s = 0;
  std::int64_t kv_bytes_per_token = 0;

  void validate() const {
    detail::require_finite_nonneg(latency_s, "LinkCostModel: latency_s");
    detail::require(kv_bytes_per_token > 0, "LinkCostModel: kv_bytes_per_token = {} must be > 0", kv_bytes_per_token);
  }
};

// KVStore in virtual time: a real InMemoryKVStore (so hits, misses and keys are real) whose loads cost
// latency + bytes / bandwidth(t). Blocks may carry no bytes: the cost uses num_tokens.
class SimulatedStore {
 public:
  SimulatedStore(LinkCostModel link, ResourceTrace trace) : link_(link), trace_(std::move(trace)) { link_.validate(); }

  [[nodiscard]] bool contains(const KVKey& key) const { return store_.contains(key); }
  [[nodiscard]] std::vector<bool> contains_many(std::span<const KVKey> keys) const {
    return store_.contains_many(keys);
  }
  [[nodiscard]] std::optional<KVBlock> get(const KVKey& key) { return store_.get(key); }
  [[nodiscard]] std::vector<std::optional<KVBlock>> get_many(std::span<const KVKey> keys) {
    return store_.get_many(keys);
  }
  void put(const KVKey& key, KVBlock block) { store_.put(key, std::move(block)); }
  bool erase(const KVKey& key) { return store_.erase(key); }

  [[nodiscard]] double load_finish_s(const KVKey&, std::int64_t num_tokens, double start_s) const {
    const double bits = static_cast<double>(num_tokens) * static_cast<double>(link_.kv_bytes_per_token) * 8.0;
    return trace_.finish(start_s + link_.latency_s, bits, [](const TracePoint& p) { return p.bandwidth_gbps * 1e9; });
  }

  [[nodiscard]] const LinkCostModel& link() const noexcept { return link_; }

 private:
  LinkCostModel link_;
  ResourceTrace trace_;
  InMemoryKVStore store_;
};

static_assert(ComputeBackend<SimulatedCompute> && CostModeledCompute<SimulatedCompute>);
static_assert(KVStore<SimulatedStore> && CostModeledStore<SimulatedStore>);

}  // namespace kvfuse
