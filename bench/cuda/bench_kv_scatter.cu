// KV scatter / gather bandwidth: kvfuse::cuda::kv_scatter writes S = 15 % of N recomputed K+V rows into the
// cache at random slots, kv_gather reads N cache rows into the prompt's contiguous buffer (a shuffled slot
// list); bf16, 8 KV heads of 128, contiguous [slots, H, d] and paged [pages, 16, H, d] caches. Bandwidth =
// bytes read + written, against a device-to-device copy of the same number of bytes measured in the same
// run. Median of 50 runs.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "bench_common.cuh"
#include "kvfuse/core/dtype.hpp"
#include "kvfuse/cuda/kv_scatter.cuh"
#include "kvfuse/harness/ref/kv_topk.hpp"

using kvfuse::bench::cuda_check;
using kvfuse::bench::median_ms;

namespace {

void check(kvfuse::Status s, const char* what) {
  if (s != kvfuse::Status::success) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, kvfuse::status_string(s), kvfuse::last_status_message());
    std::exit(1);
  }
}

template <class T>
T* device_alloc(std::size_t count) {
  T* d = nullptr;
  cuda_check(cudaMalloc(&d, count * sizeof(T)), "cudaMalloc");
  cuda_check(cudaMemset(d, 0, count * sizeof(T)), "cudaMemset");
  return d;
}

}  // namespace

int main() {
  kvfuse::bench::print_device();
  std::mt19937 rng(7);
  const std::int64_t heads = 8;
  const std::int64_t dim = 128;
  const std::int64_t page = 16;
  const std::int64_t row = heads * dim;
  std::printf("| op | cache | N | rows moved | time (us) | GB/s | D2D copy GB/s | %% of copy |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (std::int64_t n : {std::int64_t{4096}, std::int64_t{32768}, std::int64_t{131072}}) {
    const std::int64_t pages = (n + page - 1) / page;
    const auto cache_elems = static_cast<std::size_t>(pages * page * row);
    auto* cache_k = device_alloc<kvfuse::bf16>(cache_elems);
    auto* cache_v = device_alloc<kvfuse::bf16>(cache_elems);
    auto* buf_k = device_alloc<kvfuse::bf16>(static_cast<std::size_t>(n * row));
    auto* buf_v = device_alloc<kvfuse::bf16>(static_cast<std::size_t>(n * row));
    std::vector<std::int32_t> perm(static_cast<std::size_t>(n));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<std::int32_t> table(static_cast<std::size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    auto* d_slots = device_alloc<std::int32_t>(perm.size());
    auto* d_table = device_alloc<std::int32_t>(table.size());
    cuda_check(cudaMemcpy(d_slots, perm.data(), perm.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    cuda_check(cudaMemcpy(d_table, table.data(), table.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy");

    for (bool paged : {false, true}) {
      kvfuse::KVCacheLayout layout;
      layout.num_slots = n;
      layout.slot_stride = row;
      layout.head_stride = dim;
      if (paged) {
        layout.page_table = d_table;
        layout.page_size = page;
        layout.page_stride = page * row;
        layout.num_pages = pages;
      }
      kvfuse::KVScatterArgs s;
      s.src_k = buf_k;
      s.src_v = buf_v;
      s.src_token_stride = row;
      s.src_head_stride = dim;
      s.cache_k = cache_k;
      s.cache_v = cache_v;
      s.cache = layout;
      s.slots = d_slots;
      s.num_tokens = kvfuse::top_k_count(0.15, n);
      s.num_heads = heads;
      s.head_dim = dim;
      s.dtype = kvfuse::DType::bf16;
      kvfuse::KVGatherArgs g;
      g.cache_k = cache_k;
      g.cache_v = cache_v;
      g.cache = layout;
      g.dst_k = buf_k;
      g.dst_v = buf_v;
      g.dst_token_stride = row;
      g.dst_head_stride = dim;
      g.slots = d_slots;
      g.num_tokens = n;
      g.num_heads = heads;
      g.head_dim = dim;
      g.dtype = kvfuse::DType::bf16;

      const char* kind = paged ? "paged 16" : "contiguous";
      for (int op = 0; op < 2; ++op) {
        const std::int64_t rows = op == 0 ? s.num_tokens : g.num_tokens;
        const double ms = median_ms(
            [&] { check(op == 0 ? kvfuse::cuda::kv_scatter(s) : kvfuse::cuda::kv_gather(g), "copy kernel"); });
        const auto bytes = static_cast<std::size_t>(rows * row) * sizeof(kvfuse::bf16) * 2;  // K and V
        // The same bytes moved by two D2D copies (K and V): read + written = 2 * bytes.
        const double copy = kvfuse::bench::copy_ms(buf_k, cache_k, bytes / 2) * 2;
        const double traffic = 2.0 * static_cast<double>(bytes);
        std::printf("| %s | %s | %lld | %lld | %.1f | %.0f | %.0f | %.0f %% |\n", op == 0 ? "scatter" : "gather", kind,
                    static_cast<long long>(n), static_cast<long long>(rows), ms * 1e3, traffic / (ms * 1e-3) / 1e9,
                    traffic / (copy * 1e-3) / 1e9, 100.0 * copy / ms);
      }
    }
    cudaFree(cache_k);
    cudaFree(cache_v);
    cudaFree(buf_k);
    cudaFree(buf_v);
    cudaFree(d_slots);
    cudaFree(d_table);
  }
  return 0;
}
