// Top-k selection of the HKVD tokens (CacheBlend section 4.3) on the GPU: kvfuse::cuda::top_k_tokens (radix
// select + stable compaction) against the full-sort baseline top_k_tokens_by_sort (cub radix sort of
// (score, index), first k, sort k indices), at N = 4K / 32K / 128K tokens and r = 15 %; plus the KV deviation
// kernel alone (bf16 K, 8 KV heads of 128, NHD) with its bandwidth against a device-to-device copy of the
// same bytes, and deviation + top-k together. Median of 50 runs each, in microseconds, each launch timed with
// its own events (launch gaps included, as an engine's stream sees them); the radix top-k also as a CUDA
// graph replay (its 9 launches captured once: the launch gaps mostly gone). Goal: top-k <= 20 us at 128K
// on an H100.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench_common.cuh"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/cuda/kv_topk.cuh"

using kvfuse::bench::cuda_check;
using kvfuse::bench::median_ms;

namespace {

template <class T>
T* device_random(std::size_t count, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<T> host(count);
  for (auto& v : host) v = kvfuse::from_float<T>(dist(rng));
  T* d = nullptr;
  cuda_check(cudaMalloc(&d, count * sizeof(T)), "cudaMalloc");
  cuda_check(cudaMemcpy(d, host.data(), count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

void check(kvfuse::Status s, const char* what) {
  if (s != kvfuse::Status::success) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, kvfuse::status_string(s), kvfuse::last_status_message());
    std::exit(1);
  }
}

}  // namespace

int main() {
  kvfuse::bench::print_device();
  std::mt19937 rng(42);
  const std::int64_t heads = 8;
  const std::int64_t dim = 128;
  const double ratio = 0.15;
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");

  std::printf(
      "| N | k | top-k radix (us) | top-k radix, graph (us) | top-k sort baseline (us) | speed-up | "
      "deviation bf16 H=8 d=128 (us) | deviation GB/s | D2D copy GB/s | deviation + top-k (us) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|\n");
  for (std::int64_t n : {std::int64_t{4096}, std::int64_t{32768}, std::int64_t{131072}}) {
    const std::int64_t k = kvfuse::top_k_count(ratio, n);
    const auto elems = static_cast<std::size_t>(n * heads * dim);
    auto* rec = device_random<kvfuse::bf16>(elems, -1.0f, 1.0f, rng);
    auto* cac = device_random<kvfuse::bf16>(elems, -1.0f, 1.0f, rng);
    float* dev = nullptr;
    std::int32_t* out = nullptr;
    cuda_check(cudaMalloc(&dev, static_cast<std::size_t>(n) * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMalloc(&out, static_cast<std::size_t>(k) * sizeof(std::int32_t)), "cudaMalloc");
    const std::size_t ws_bytes = kvfuse::cuda::top_k_workspace_bytes(n);
    const std::size_t sort_bytes = kvfuse::cuda::top_k_by_sort_workspace_bytes(n);
    void* ws = nullptr;
    void* sort_ws = nullptr;
    cuda_check(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
    cuda_check(cudaMalloc(&sort_ws, sort_bytes), "cudaMalloc");

    kvfuse::KVDeviationArgs d;
    d.recomputed = rec;
    d.cached = cac;
    d.deviation = dev;
    d.dtype = kvfuse::DType::bf16;
    d.num_tokens = n;
    d.num_heads = heads;
    d.head_dim = dim;
    d.recomputed_token_stride = d.cached_token_stride = heads * dim;
    d.recomputed_head_stride = d.cached_head_stride = dim;
    kvfuse::TopKArgs t;
    t.scores = dev;
    t.indices = out;
    t.num_items = n;
    t.k = k;
    check(kvfuse::cuda::kv_deviation(d, stream), "kv_deviation");  // scores for the top-k timings

    const double radix_ms =
        median_ms([&] { check(kvfuse::cuda::top_k_tokens(t, ws, ws_bytes, stream), "top_k"); }, stream);
    // A capture that fails (it should not: the launcher allocates nothing and never synchronizes) prints nan.
    double graph_ms = NAN;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t graph_exec = nullptr;
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
      const kvfuse::Status captured = kvfuse::cuda::top_k_tokens(t, ws, ws_bytes, stream);
      if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && captured == kvfuse::Status::success &&
          cudaGraphInstantiate(&graph_exec, graph, 0) == cudaSuccess) {
        graph_ms = median_ms([&] { cuda_check(cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch"); }, stream);
      }
    }
    if (std::isnan(graph_ms)) std::fprintf(stderr, "top-k graph capture failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    if (graph_exec != nullptr) cudaGraphExecDestroy(graph_exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
    const double sort_ms =
        median_ms([&] { check(kvfuse::cuda::top_k_tokens_by_sort(t, sort_ws, sort_bytes, stream), "sort"); }, stream);
    const double dev_ms = median_ms([&] { check(kvfuse::cuda::kv_deviation(d, stream), "kv_deviation"); }, stream);
    const double both_ms = median_ms(
        [&] {
          check(kvfuse::cuda::kv_deviation(d, stream), "kv_deviation");
          check(kvfuse::cuda::top_k_tokens(t, ws, ws_bytes, stream), "top_k");
        },
        stream);
    const double bytes = 2.0 * static_cast<double>(elems) * sizeof(kvfuse::bf16);  // two tensors read
    const double copy = kvfuse::bench::copy_ms(cac, rec, elems * sizeof(kvfuse::bf16), stream);
    std::printf("| %lld | %lld | %.1f | %.1f | %.1f | %.2fx | %.1f | %.0f | %.0f | %.1f |\n", static_cast<long long>(n),
                static_cast<long long>(k), radix_ms * 1e3, graph_ms * 1e3, sort_ms * 1e3, sort_ms / radix_ms, dev_ms * 1e3,
                bytes / (dev_ms * 1e-3) / 1e9, bytes / (copy * 1e-3) / 1e9, both_ms * 1e3);
    cudaFree(rec);
    cudaFree(cac);
    cudaFree(dev);
    cudaFree(out);
    cudaFree(ws);
    cudaFree(sort_ws);
  }
  cudaStreamDestroy(stream);
  return 0;
}
