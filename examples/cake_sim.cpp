// kvfuse-cake-sim: Cake's bidirectional loader in virtual time, next to compute-only, I/O-only and the
// best static split. Prints one JSON object.
//
//   kvfuse-cake-sim --seq-len 16384 --kv-bytes-per-token 800000 --bandwidth-gbps 32 --gpu-share 1
//                   --compute-ms 60,2 [--compute-chunk 512] [--fetch-chunk 128] [--latency-ms 0]
//                   [--trace FILE]
//
// Compute chunk i takes A + B·i ms at 100 % GPU share (A, B from --compute-ms); at share s it takes that / s.
// --trace FILE: lines "t_ms gpu_share bandwidth_gbps" (a step function); it replaces --gpu-share and
// --bandwidth-gbps.

#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <numeric>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "kvfuse/harness/simulated.hpp"
#include "kvfuse/schedule/bidirectional_loader.hpp"

namespace {

struct Options {
  std::int64_t seq_len = 16384;
  std::int64_t kv_bytes_per_token = 800'000;
  std::int64_t compute_chunk = 512;
  std::int64_t fetch_chunk = 128;
  double bandwidth_gbps = 32;
  double gpu_share = 1;
  double a_ms = 0, b_ms = 0;
  double latency_ms = 0;
  std::string trace_file;
};

double parse_double(std::string_view flag, std::string_view v) {
  double x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  kvfuse::require(ec == std::errc{} && p == v.data() + v.size(), "{}: '{}' is not a number", flag, v);
  return x;
}

std::int64_t parse_int(std::string_view flag, std::string_view v) {
  std::int64_t x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  kvfuse::require(ec == std::errc{} && p == v.data() + v.size(), "{}: '{}' is not an integer", flag, v);
  return x;
}

Options parse(int argc, char** argv) {
  Options o;
  bool have_compute = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::puts(
          "kvfuse-cake-sim --seq-len N --kv-bytes-per-token B --compute-ms A,B [--compute-chunk 512]\n"
          "                [--fetch-chunk 128] [--bandwidth-gbps G] [--gpu-share S] [--latency-ms L]\n"
          "                [--trace FILE]");
      std::exit(0);
    }
    kvfuse::require(i + 1 < argc, "{} needs a value", flag);
    std::string_view v = argv[++i];
    if (flag == "--seq-len") o.seq_len = parse_int(flag, v);
    else if (flag == "--kv-bytes-per-token") o.kv_bytes_per_token = parse_int(flag, v);
    else if (flag == "--compute-chunk") o.compute_chunk = parse_int(flag, v);
    else if (flag == "--fetch-chunk") o.fetch_chunk = parse_int(flag, v);
    else if (flag == "--bandwidth-gbps") o.bandwidth_gbps = parse_double(flag, v);
    else if (flag == "--gpu-share") o.gpu_share = parse_double(flag, v);
    else if (flag == "--latency-ms") o.latency_ms = parse_double(flag, v);
    else if (flag == "--trace") o.trace_file = std::string(v);
    else if (flag == "--compute-ms") {
      const auto comma = v.find(',');
      kvfuse::require(comma != std::string_view::npos, "--compute-ms: expected A,B, got '{}'", v);
      o.a_ms = parse_double(flag, v.substr(0, comma));
      o.b_ms = parse_double(flag, v.substr(comma + 1));
      have_compute = true;
    } else {
      throw kvfuse::error(fmt::format("unknown flag '{}' (see --help)", flag));
    }
  }
  kvfuse::require(have_compute, "--compute-ms A,B is required");
  kvfuse::require(o.seq_len >= 0, "--seq-len {} must be >= 0", o.seq_len);
  return o;
}

kvfuse::ResourceTrace make_trace(const Options& o) {
  if (o.trace_file.empty()) return kvfuse::ResourceTrace::constant(o.gpu_share, o.bandwidth_gbps);
  std::ifstream in(o.trace_file);
  kvfuse::require(in.good(), "--trace: cannot open '{}'", o.trace_file);
  std::stringstream text;
  text << in.rdbuf();
  return kvfuse::ResourceTrace::parse(text.str());
}

}  // namespace

int main(int argc, char** argv) try {
  const Options o = parse(argc, argv);
  const kvfuse::ResourceTrace trace = make_trace(o);
  const kvfuse::ComputeCostModel cost{o.a_ms / 1e3, o.b_ms / 1e3, o.compute_chunk};
  const kvfuse::LinkCostModel link{o.latency_ms / 1e3, o.kv_bytes_per_token};

  // The whole prompt is stored as a prefix cache in fetch-chunk blocks (no bytes: the simulator moves none).
  std::vector<kvfuse::token_id> tokens(static_cast<std::size_t>(o.seq_len));
  std::iota(tokens.begin(), tokens.end(), 0);

  // A-priori estimate from the rates at t = 0, as an engine would profile them.
  const kvfuse::TracePoint& p0 = trace.at(0);
  kvfuse::LoaderEstimate est;
  if (p0.gpu_share > 0) {
    est.compute_a_s = cost.a_s / p0.gpu_share;
    est.compute_b_s = cost.b_s / p0.gpu_share;
  }
  if (p0.bandwidth_gbps > 0)
    est.fetch_chunk_s = link.latency_s + static_cast<double>(o.fetch_chunk * o.kv_bytes_per_token) * 8 /
                                             (p0.bandwidth_gbps * 1e9);

  auto run = [&](kvfuse::LoaderMode mode) {
    kvfuse::SimulatedCompute compute(cost, trace);
    kvfuse::SimulatedStore store(link, trace);
    const auto keys = kvfuse::prefix_chunk_keys(compute.model_fingerprint(), tokens, o.fetch_chunk);
    for (std::size_t j = 0; j < keys.size(); ++j) {
      const std::int64_t b = static_cast<std::int64_t>(j) * o.fetch_chunk;
      store.put(keys[j], kvfuse::KVBlock{std::min(o.fetch_chunk, o.seq_len - b), {}});
    }
    kvfuse::LoaderConfig cfg{o.compute_chunk, o.fetch_chunk, mode};
    kvfuse::BidirectionalLoader<kvfuse::SimulatedCompute, kvfuse::SimulatedStore> loader(cfg, est);
    return std::pair{loader.run(compute, store, tokens), kvfuse::best_static_split(compute, store, tokens,
                                                                                   o.seq_len, cfg)};
  };

  const auto [cake, oracle] = run(kvfuse::LoaderMode::adaptive);
  const auto paper = run(kvfuse::LoaderMode::bidirectional).first;
  const auto compute_only = run(kvfuse::LoaderMode::compute_only).first;
  const auto io_only = run(kvfuse::LoaderMode::load_only).first;

  fmt::print(
      "{{\"ttft_ms\": {{\"cake\": {:.3f}, \"compute_only\": {:.3f}, \"io_only\": {:.3f}, \"oracle\": {:.3f}, "
      "\"cake_paper\": {:.3f}}}, \"meet_token\": {}, \"computed_tokens\": {}, \"loaded_tokens\": {}, "
      "\"oracle_split\": {}, \"skipped_compute_chunks\": {}}}\n",
      cake.ready_s * 1e3, compute_only.ready_s * 1e3, io_only.ready_s * 1e3, oracle.ready_s * 1e3,
      paper.ready_s * 1e3, cake.meet_token, cake.computed_tokens, cake.loaded_tokens, oracle.split,
      cake.skipped_compute_chunks);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "kvfuse-cake-sim: {}\n", e.what());
  return 2;
}
